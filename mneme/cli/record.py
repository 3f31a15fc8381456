"""`mneme record`: run an application and record its kernel launches"""

from __future__ import annotations

import argparse

from mneme.cli.command import Command, not_landed


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


COMMANDS = [Command("record", "run an application and record its kernel launches", configure, not_landed("mneme record", 3))]
