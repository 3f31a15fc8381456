"""`mneme serve`: run a per-GPU gRPC replay server"""

from __future__ import annotations

import argparse

from mneme.cli.command import Command, not_landed


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


COMMANDS = [Command("serve", "run a per-GPU gRPC replay server", configure, not_landed("mneme serve", 5))]
