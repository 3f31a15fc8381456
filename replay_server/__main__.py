"""``python -m replay_server ...`` is ``mneme serve ...``."""

import argparse
import sys

from mneme.errors import run_command
from replay_server.server import cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mneme serve", description=cli.HELP)
    cli.configure(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return run_command("serve", lambda: cli.run(args))


if __name__ == "__main__":
    sys.exit(main())
