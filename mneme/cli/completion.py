"""`mneme completion bash|zsh|tcsh`: print the shell's completion script for every command and flag.

The script is generated from the parsers by shtab (static: nothing of mneme runs when the shell
completes, and nothing is added to mneme's start-up). Paths complete as files or directories by the
names their help shows (``DIR``, ``FILE``, ``*.json``, a store location).
"""

from __future__ import annotations

import argparse

from mneme.cli.command import Command

SHELLS = ("bash", "zsh", "tcsh")
#: Arguments whose values are directories, by the name their help shows (a store location may also be
#: s3://..., which no shell completes).
DIRECTORIES = frozenset({"DIR", "DIR_OR_S3_PREFIX", "URL", "SRC", "DST", "STORE"})
#: Arguments whose values are files (or directories: a shell's file completion offers both).
FILES = frozenset({"FILE", "PATH", "FILE.json", "FILE.yml", "DB.json", "RESULTS", "A", "B", "TOKEN_FILE",
                   "TLS_CERT", "TLS_KEY", "TLS_CLIENT_CA", "-- APP [ARGS...]"})
#: Arguments named like a path that are not one.
NOT_PATHS = frozenset({"optuna_storage"})


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=SHELLS,
                        help="the shell; bash: eval \"$(mneme completion bash)\" in ~/.bashrc, or write it to "
                        "a file bash-completion loads (docs/cli.md#shell-completion)")


def path_hints(parser: argparse.ArgumentParser) -> None:
    """Mark the arguments of ``parser`` and its subcommands that take paths, for shtab (``action.complete``).

    Args:
        parser: the ``mneme`` parser, with every command.
    """
    import shtab

    for action in parser._actions:  # noqa: SLF001 - argparse has no public accessor
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for sub in action.choices.values():
                path_hints(sub)
            continue
        name = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
        if action.dest in NOT_PATHS:
            continue
        if name in DIRECTORIES:
            action.complete = shtab.DIRECTORY
        elif name in FILES:
            action.complete = shtab.FILE


def script(shell: str) -> str:
    """The completion script of ``mneme`` for ``shell`` (one of :data:`SHELLS`)."""
    import shtab

    from mneme.cli import build_parser

    parser = build_parser()
    path_hints(parser)
    return shtab.complete(parser, shell=shell)


def run(args: argparse.Namespace) -> int:
    print(script(args.shell))
    return 0


COMMANDS = [Command("completion", "print the shell completion script (bash, zsh, tcsh) of every command and flag",
                    configure, run)]
