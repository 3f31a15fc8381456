"""The shape every subcommand has."""

from __future__ import annotations

import argparse
from collections import namedtuple


class Command(namedtuple("Command", "name help configure run")):
    """One ``mneme NAME`` subcommand: ``name``, its ``help`` line, ``configure(parser)`` adding its
    arguments, and ``run(args) -> exit status``, its action.

    A named tuple, not a dataclass: ``mneme record`` builds its parser before it starts the
    application, and ``dataclasses`` (with ``inspect``) would add its import to that start-up.
    """

    __slots__ = ()



def add_application_argument(parser: argparse.ArgumentParser) -> None:
    """``-- APP [ARGS...]``: the application a command runs (``mneme record``, ``mneme run``)."""
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- APP [ARGS...]",
                        help="the application and its arguments, after '--'")


def application_command(args: argparse.Namespace) -> list[str]:
    """The application and its arguments, without the ``--`` that separates them from mneme's options."""
    command = list(args.command)
    return command[1:] if command and command[0] == "--" else command
