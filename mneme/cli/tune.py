"""`mneme tune`: tune a recorded kernel instance"""

from __future__ import annotations

import argparse

from mneme.cli.command import Command, not_landed


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


COMMANDS = [Command("tune", "tune a recorded kernel instance", configure, not_landed("mneme tune", 6))]
