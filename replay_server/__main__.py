"""``python -m replay_server ...`` is ``mneme serve ...``."""

import sys

from mneme.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
