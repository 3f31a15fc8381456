"""The ``mneme`` command line.

Each module listed in ``CLI_MODULES`` defines ``COMMANDS``, a list of
:class:`mneme.cli.command.Command`. Modules import their heavy dependencies
inside the ``run`` functions so that ``mneme --help`` stays fast and works on
machines without a GPU.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from mneme import __version__
from mneme.errors import MnemeError, Terminated

CLI_MODULES = ["record", "replay", "tune", "run", "serve", "store_cmds", "config"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mneme",
        description="Record CUDA kernel launches, replay them standalone and bit-exact, tune them.",
    )
    parser.add_argument("--version", action="version", version=f"mneme {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module_name in CLI_MODULES:
        module = importlib.import_module(f"mneme.cli.{module_name}")
        for command in module.COMMANDS:
            p = sub.add_parser(command.name, help=command.help, description=command.help)
            command.configure(p)
            p.set_defaults(_command=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = args._command
    try:
        return int(command.run(args) or 0)
    except MnemeError as exc:
        print(f"mneme {command.name}: error: {exc}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"mneme {command.name}: terminated (SIGTERM)", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"mneme {command.name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
