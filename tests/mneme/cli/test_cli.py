"""The `mneme` command: every subcommand has a real --help; errors exit non-zero with a message."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mneme.cli import CLI_MODULES, COMMAND_MODULES, build_parser, main

SUBCOMMANDS = ["record", "replay", "export-reproducer", "tune", "run", "serve", "push", "pull", "ls", "check", "gc",
               "clean", "copy", "move", "config", "study-server"]


def run_mneme(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mneme", *args], capture_output=True, text=True, timeout=120)


def test_every_subcommand_is_registered():
    parser = build_parser()
    registered = set(parser._subparsers._group_actions[0].choices)  # noqa: SLF001 - argparse has no public accessor
    assert registered == set(SUBCOMMANDS)
    assert CLI_MODULES


def test_the_command_table_names_each_commands_module():
    import importlib

    found = {command.name: module for module in CLI_MODULES
             for command in importlib.import_module(f"mneme.cli.{module}").COMMANDS}
    assert COMMAND_MODULES == found


def test_a_command_imports_only_its_own_cli_module():
    probe = ("import sys; from mneme.cli import build_parser; build_parser('ls'); "
             "print(sorted(m for m in sys.modules if m.startswith('mneme.cli.')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "['mneme.cli.command', 'mneme.cli.store_cmds']", done.stderr


def test_top_level_help_lists_subcommands():
    proc = run_mneme("--help")
    assert proc.returncode == 0
    for name in SUBCOMMANDS:
        assert name in proc.stdout


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_subcommand_help(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: mneme " + name)


def test_unknown_subcommand_fails():
    proc = run_mneme("frobnicate")
    assert proc.returncode != 0
    assert "invalid choice" in proc.stderr


def test_version():
    proc = run_mneme("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("mneme ")
