"""`mneme config`: print the paths and flags of the instrumented build."""

from __future__ import annotations

import argparse

from mneme.cli.command import Command, not_landed


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=["cc", "cxx", "prefix", "libdir", "includedir", "cmakedir", "cflags", "ldflags"])


COMMANDS = [Command("config", "print paths and flags of mneme's instrumented build", configure, not_landed("mneme config", 8))]
