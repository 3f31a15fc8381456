"""``python -m mneme.toolchain MODE ARGS...`` (MODE: cc, c++ or embed); what the launchers run."""

import sys

from mneme.toolchain.wrapper import main

if len(sys.argv) < 2:
    print("usage: python -m mneme.toolchain {cc,c++,embed} ARGS...", file=sys.stderr)
    sys.exit(2)
sys.exit(main(sys.argv[1], sys.argv[2:]))
