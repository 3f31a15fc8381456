"""Artifact-store subcommands: push, pull, ls, gc, clean, copy, move."""

from __future__ import annotations

import argparse

from mneme.cli.command import Command, not_landed


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


COMMANDS = [
    Command("push", "upload a recording directory to a store", configure, not_landed("mneme push", 7)),
    Command("pull", "download recordings from a store to a directory", configure, not_landed("mneme pull", 7)),
    Command("ls", "list recordings, kernels, instances and sizes in a store", configure, not_landed("mneme ls", 7)),
    Command("gc", "remove chunks no recording references", configure, not_landed("mneme gc", 7)),
    Command("clean", "delete recordings", configure, not_landed("mneme clean", 7)),
    Command("copy", "copy recordings between stores", configure, not_landed("mneme copy", 7)),
    Command("move", "move recordings between stores", configure, not_landed("mneme move", 7)),
]
