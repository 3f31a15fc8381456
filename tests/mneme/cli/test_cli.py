"""The `mneme` command: every subcommand has a real --help; errors exit non-zero with a message, said by the
(sub)command's own parser; shell completion scripts name every command."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from mneme.cli import CLI_MODULES, COMMAND_MODULES, build_parser, main
from mneme.cli.completion import SHELLS, script

SUBCOMMANDS = ["record", "replay", "export-reproducer", "tune", "run", "serve", "push", "pull", "ls", "check", "gc",
               "clean", "copy", "move", "config", "study-server", "completion"]
TUNE_SUBCOMMANDS = ["report", "compare", "export"]


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


@pytest.mark.parametrize("name", SUBCOMMANDS + [f"tune {verb}" for verb in TUNE_SUBCOMMANDS])
def test_subcommand_help(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*name.split(), "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: mneme " + name)


def test_tune_report_help_is_the_reports_own(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "report", "--help"])
    out = capsys.readouterr().out
    assert "--optuna-storage URL" in out and "DIR" in out
    assert "--sampler" not in out and "--space-preset" not in out  # not the tuning run's help


def test_tune_help_lists_its_subcommands(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    out = capsys.readouterr().out
    assert all(verb in out for verb in TUNE_SUBCOMMANDS) and "--sampler" in out and "--json" in out


@pytest.mark.parametrize("argv, prog, unknown", [
    (["tune", "--nope"], "mneme tune", "--nope"),
    (["tune", "-rdb", "x.json", "--nope=1", "--quiet"], "mneme tune", "--nope=1"),
    (["tune", "report", "results/x", "--nope"], "mneme tune report", "--nope"),
    (["tune", "compare", "a", "b", "c"], "mneme tune compare", "c"),
    (["tune", "export", "d", "--csv", "t.csv", "--nope"], "mneme tune export", "--nope"),
    (["ls", "store", "--nope"], "mneme ls", "--nope"),
    (["push", "a", "b", "--nope"], "mneme push", "--nope"),
    (["gc", "store", "--nope", "--dry-run"], "mneme gc", "--nope"),
    (["replay", "-rdb", "x.json", "--nope"], "mneme replay", "--nope"),
    (["config", "cc", "--nope"], "mneme config", "--nope"),
    (["serve", "--gpu", "0", "--nope"], "mneme serve", "--nope"),
    (["completion", "bash", "--nope"], "mneme completion", "--nope"),
])
def test_an_unknown_argument_is_an_error_of_its_own_subcommand(argv, prog, unknown, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {prog} ")  # the subcommand's usage, not the top-level one
    assert err.endswith(f"\n{prog}: error: unrecognized arguments: {unknown}\n")


def test_an_unknown_flag_through_the_real_command():
    proc = run_mneme("tune", "--nope")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("usage: mneme tune ")
    assert proc.stderr.splitlines()[-1] == "mneme tune: error: unrecognized arguments: --nope"


def test_an_unknown_tune_subcommand_names_the_choices(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["tune", "frobnicate"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "mneme tune: error:" in err and "invalid choice: 'frobnicate'" in err and "'report'" in err


def test_a_tuning_flag_with_a_tune_subcommand_is_refused_not_ignored(capsys):
    assert main(["tune", "--sampler", "tpe", "report", "results/x"]) == 2
    assert "mneme tune: error: --sampler: for a tuning run, not for mneme tune report" in capsys.readouterr().err
    assert main(["tune", "report"]) == 2
    assert "mneme tune report DIR" in capsys.readouterr().err


def test_unknown_subcommand_fails():
    proc = run_mneme("frobnicate")
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr and proc.stderr.startswith("usage: mneme ")


def test_the_command_line_builds_without_the_completion_generator():
    probe = "import sys; from mneme.cli import build_parser; build_parser(); print('shtab' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


@pytest.mark.parametrize("shell", SHELLS)
def test_the_completion_script_names_every_command_and_flag(shell):
    text = script(shell)
    for word in SUBCOMMANDS + TUNE_SUBCOMMANDS:
        assert word in text, f"{word} is not in the {shell} script"
    flags = ["--json", "--optuna-storage", "--sampler", "--read-data", "--record-db", "--apply"]
    for flag in flags if shell != "tcsh" else ["--record-db", "--sampler"]:  # tcsh's: the flags that take values
        assert flag in text, f"{flag} is not in the {shell} script"


def test_completion_prints_the_script(capsys):
    assert main(["completion", "zsh"]) == 0
    assert capsys.readouterr().out.startswith("#compdef mneme")


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.parametrize("line, expected", [
    ("mneme tu", ["tune"]),
    ("mneme tune re", ["report"]),
    ("mneme tune report --", ["--help", "--optuna-storage", "--results-dir", "--study-name"]),
    ("mneme tune --sampler ", ["exhaustive", "grid", "nsga2", "random", "tpe"]),
    ("mneme gc store --", ["--dry-run", "--grace", "--help", "--json", "--retries"]),
    ("mneme replay -rdb d", ["dir", "db.json"]),
    ("mneme record -rdb d", ["dir"]),
])
def test_bash_completes_with_the_script(tmp_path, line, expected):
    """The script in a real bash, as the shell calls it at a TAB (COMP_WORDS, COMP_CWORD)."""
    (tmp_path / "completion.bash").write_text(script("bash"))
    (tmp_path / "dir").mkdir()
    (tmp_path / "db.json").write_text("{}")
    words = line.split(" ")
    program = (f"source completion.bash; COMP_WORDS=({' '.join(repr(w) for w in words)}); "
               f"COMP_CWORD={len(words) - 1}; COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}; _shtab_mneme; "
               "printf '%s\\n' \"${COMPREPLY[@]}\"")
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert sorted(done.stdout.split()) == sorted(expected), done.stderr


def test_version():
    proc = run_mneme("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("mneme ")


@pytest.mark.parametrize("line, verb, expected", [
    ("tune report results/vecadd", "report", {"directories": ["results/vecadd"]}),
    ("tune report run-a run-b --optuna-storage journal:s.log --study-name vecadd", "report",
     {"directories": ["run-a", "run-b"], "optuna_storage": "journal:s.log", "study_name": "vecadd"}),
    ("tune report --optuna-storage grpc://h:13000 --study-name s --results-dir merged", "report",
     {"directories": [], "optuna_storage": "grpc://h:13000", "results_dir": "merged"}),
    ("tune compare results/a results/b", "compare", {"first": "results/a", "second": "results/b"}),
    ("tune export results/a --csv", "export", {"directory": "results/a", "csv": ""}),
    ("tune export results/a --csv -", "export", {"directory": "results/a", "csv": "-"}),
    ("tune -rdb rec/1.json --space-preset launch --launch-dim x --results-dir results/vecadd", None,
     {"record_database": "rec/1.json", "results_dir": "results/vecadd"}),
    ("tune --resume --results-dir results/vecadd --trials 9 --json", None, {"resume": True, "json": True}),
])
def test_the_documented_tune_command_lines_parse(line, verb, expected):
    from mneme.cli import parse

    args = parse(build_parser("tune"), line.split())
    assert args.tune_command == verb
    assert {key: getattr(args, key) for key in expected} == expected
