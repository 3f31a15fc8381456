"""The shape every subcommand has."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Command:
    """One ``mneme NAME`` subcommand: its help line, its arguments, its action."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]



def add_application_argument(parser: argparse.ArgumentParser) -> None:
    """``-- APP [ARGS...]``: the application a command runs (``mneme record``, ``mneme run``)."""
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- APP [ARGS...]",
                        help="the application and its arguments, after '--'")


def application_command(args: argparse.Namespace) -> list[str]:
    """The application and its arguments, without the ``--`` that separates them from mneme's options."""
    command = list(args.command)
    return command[1:] if command and command[0] == "--" else command
