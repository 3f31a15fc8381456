"""The ``mneme`` command line.

Each module listed in ``CLI_MODULES`` defines ``COMMANDS``, a list of
:class:`mneme.cli.command.Command`. Modules import their heavy dependencies
inside the ``run`` functions so that ``mneme --help`` stays fast and works on
machines without a GPU; ``mneme NAME ...`` imports only the module of NAME
(``COMMAND_MODULES``), which is what a command's start-up pays for.

Every parser reports its own errors with its own usage: an unknown flag of
``mneme tune`` is ``mneme tune: error: unrecognized arguments: ...`` (exit
status 2), of ``mneme tune report`` the report's (:func:`main`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from mneme import __version__
from mneme._internal.startup_trace import mark
from mneme.cli.command import add_subcommand
from mneme.errors import run_command

CLI_MODULES = ["record", "replay", "reproducer", "tune", "run", "serve", "store_cmds", "config", "study_server",
               "completion"]
#: The module of each command: `mneme NAME` imports just that one. A command missing here still works
#: (then every module is imported); tests/mneme/cli/test_cli.py checks this table against the modules.
COMMAND_MODULES = {
    "record": "record", "replay": "replay", "export-reproducer": "reproducer", "tune": "tune", "run": "run",
    "serve": "serve", "config": "config", "study-server": "study_server", "completion": "completion",
    **{name: "store_cmds" for name in ("push", "pull", "ls", "check", "gc", "clean", "copy", "move")},
}


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, with the terminal's width found without ``shutil``.

    argparse imports ``shutil`` (and with it ``bz2``, ``lzma``, ``fnmatch``) for ``get_terminal_size``
    each time a parser checks an argument: a millisecond or two of every command's start-up, which
    ``mneme record`` pays before it starts the application. Same width: ``COLUMNS``, else the
    terminal of stdout, else 80; minus 2, as argparse does.
    """

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None):
        if width is None:
            width = _terminal_columns() - 2
        super().__init__(prog, indent_increment, max_help_position, width)


def _terminal_columns() -> int:
    try:
        columns = int(os.environ["COLUMNS"])
        if columns > 0:
            return columns
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return 80


def _command_name(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names (its first word that is not an option), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or (``command`` in COMMAND_MODULES) of that one only."""
    parser = argparse.ArgumentParser(
        prog="mneme",
        description="Record CUDA kernel launches, replay them standalone and bit-exact, tune them.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mneme {__version__}")
    parser.set_defaults(_parser=parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    only = command if command in COMMAND_MODULES else None
    for module_name in [COMMAND_MODULES[only]] if only else CLI_MODULES:
        module = importlib.import_module(f"mneme.cli.{module_name}")
        for found in module.COMMANDS:
            if only and found.name != only:
                continue
            p = add_subcommand(sub, found.name, found.help, formatter_class=_HelpFormatter)
            found.configure(p)
            p.set_defaults(_command=found)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed; what no parser knew is an error of the innermost (sub)command it came with.

    ``ArgumentParser.parse_args`` would report ``mneme tune --nope`` with the top-level usage: here
    ``mneme tune: error: unrecognized arguments: --nope`` comes with ``mneme tune``'s usage (exit 2).

    Args:
        parser: :func:`build_parser`'s.
        argv: the arguments after ``mneme``.

    Returns:
        The namespace (``_command``: the command; ``_parser``: the innermost parser chosen).
    """
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        args._parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    mark("cli", "start")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(build_parser(_command_name(argv)), argv)
    mark("cli", "parsed")
    command = args._command
    return run_command(command.name, lambda: command.run(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
