"""The shape every subcommand has, and the conventions they share (sub-subcommands, ``--json``)."""

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


def add_subcommand(subparsers: object, name: str, help: str, **kwargs: object) -> argparse.ArgumentParser:
    """A subcommand's parser (``mneme NAME``, ``mneme tune report``): its own ``--help``, and errors (an
    unknown flag included, :func:`mneme.cli.main`) said with its own usage.

    Args:
        subparsers: what ``ArgumentParser.add_subparsers`` returned.
        name: the word that selects it.
        help: its one-line help (also its description).
        **kwargs: more ``add_parser`` arguments (``formatter_class``).

    Returns:
        The parser; ``_parser`` in the parsed namespace is the innermost one the command line chose.
    """
    parser = subparsers.add_parser(name, help=help, description=help, **kwargs)
    parser.set_defaults(_parser=parser)
    return parser


def add_json_argument(parser: argparse.ArgumentParser, what: str = "the summary") -> None:
    """``--json``: the command prints ``what`` as one JSON object on standard output (:func:`print_json`)."""
    parser.add_argument("--json", action="store_true", help=f"print {what} as one JSON object on standard output")


def print_json(data: object) -> None:
    """What ``--json`` prints: one JSON document on standard output, indented, ending with a newline."""
    import json  # not at import time: ``mneme record`` parses its arguments before the application starts

    print(json.dumps(data, indent=2))


def add_application_argument(parser: argparse.ArgumentParser) -> None:
    """``-- APP [ARGS...]``: the application a command runs (``mneme record``, ``mneme run``)."""
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- APP [ARGS...]",
                        help="the application and its arguments, after '--'")


def application_command(args: argparse.Namespace) -> list[str]:
    """The application and its arguments, without the ``--`` that separates them from mneme's options."""
    command = list(args.command)
    return command[1:] if command and command[0] == "--" else command
