"""`mneme replay`: replay one recorded kernel instance and verify it"""

from __future__ import annotations

import argparse

from mneme.cli.command import Command, not_landed


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


COMMANDS = [Command("replay", "replay one recorded kernel instance and verify it", configure, not_landed("mneme replay", 4))]
