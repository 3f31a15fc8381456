"""`mneme tune`: tune a recorded kernel instance; its subcommands work on results directories:
`mneme tune report DIR`: plot a run; `mneme tune compare A B`: two runs side by side; `mneme tune export DIR
--csv`: a run's trials as a table.

Each subcommand has its own parser (its own ``--help``, its errors with its own usage); ``mneme tune`` with
no subcommand is a tuning run. The logic of each is in ``tuner``; the imports stay inside the functions so
that ``mneme tune --help`` does not pay for them.
"""

from __future__ import annotations

import argparse
import sys

from mneme.cli.command import Command, add_json_argument, add_subcommand, print_json
from mneme.errors import ConfigurationError

S = argparse.SUPPRESS


def configure(parser: argparse.ArgumentParser) -> None:
    from tuner.cli_args import add_arguments

    sub = parser.add_subparsers(dest="tune_command", metavar="{report,compare,export}",
                                title="subcommands (on results directories; without one: a tuning run)")
    _configure_report(add_subcommand(
        sub, "report", "write the plots and the HTML page of a run (DIR/report/); several DIRs or "
        "--optuna-storage: print the merged summary of a shared study"))
    _configure_compare(add_subcommand(sub, "compare", "print two runs side by side"))
    _configure_export(add_subcommand(sub, "export", "write a run's trials as CSV"))
    add_arguments(parser)
    parser.epilog = ("Each subcommand has its own --help (mneme tune report --help). Plots of a finished run: "
                     "mneme tune report DIR; one view of a shared study: mneme tune report DIR DIR ... or "
                     "mneme tune report --optuna-storage URL --study-name NAME; two runs side by side: "
                     "mneme tune compare A B; the trials as a table: mneme tune export DIR --csv [PATH]")
    add_json_argument(parser, "the run's summary (results directory, counts, best; the human table goes to "
                      "standard error)")


def _configure_report(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directories", nargs="*", metavar="DIR",
                        help="results directories of `mneme tune`; one: write DIR/report/ (PNG needs matplotlib, "
                        "HTML plotly: pip install 'mneme[plots]'); several (the processes of one shared study): "
                        "print their merged summary")
    parser.add_argument("--optuna-storage", metavar="URL", default=S,
                        help="the shared study's storage (as `mneme tune --optuna-storage`): print its summary")
    parser.add_argument("--study-name", metavar="NAME", default=S, help="the study of --optuna-storage")
    parser.add_argument("--results-dir", metavar="DIR", default=S,
                        help="with several DIRs or --optuna-storage: also write the merged summary to "
                        "DIR/merged_summary.json")


def _configure_compare(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("first", metavar="A", help="a results directory")
    parser.add_argument("second", metavar="B", help="another one; B's times are compared with A's")


def _configure_export(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DIR", help="a results directory")
    parser.add_argument("--csv", nargs="?", const="", metavar="PATH",
                        help="the trials as CSV with flat columns, to PATH (default DIR/trials.csv; '-': standard "
                        "output)")


def run(args: argparse.Namespace) -> int:
    verb = getattr(args, "tune_command", None)
    if verb is not None:
        _refuse_tuning_flags(args, verb)
        return {"report": _run_report, "compare": _run_compare, "export": _run_export}[verb](args)
    given = {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "tune_command"}
    as_json = given.pop("json", False)
    from tuner.options import resolve_options
    from tuner.resume import resume_settings

    config_file = given.pop("config", None)
    base = resume_settings(given["results_dir"]) if given.get("resume") and given.get("results_dir") else None
    options = resolve_options(given, config_file, base)
    if not as_json:
        from tuner.run import run_tune

        return run_tune(options)
    return _run_tune_json(options)


def _run_tune_json(options) -> int:
    """``mneme tune --json``: what the run prints for a person goes to standard error, and its summary (the
    results directory, the counts, the best) to standard output as one JSON object, also when the run
    stopped early (interrupted, failed) after its results directory was made."""
    from tuner.run import TuneRun

    json_only = options.print_space or options.dry_run  # what they print is JSON already
    tune = TuneRun(options, out=sys.stdout if json_only else sys.stderr)
    try:
        return tune.run()
    finally:
        summary = tune.json_summary()
        if summary is not None:
            print_json(summary)


def _refuse_tuning_flags(args: argparse.Namespace, verb: str) -> None:
    """A flag of the tuning run given with a subcommand, which would ignore it: said, not ignored."""
    from tuner.cli_args import add_arguments

    tuning = argparse.ArgumentParser(add_help=False)
    add_arguments(tuning)  # its flags are "not given" (absent from args) unless given
    own = {action.dest for action in args._parser._actions}  # noqa: SLF001 - the subcommand's own flags
    flags = {}  # dest -> its longest flag (--record-database for -rdb)
    for action in tuning._actions:  # noqa: SLF001
        flags.setdefault(action.dest, max(action.option_strings, key=len))
    stray = [flag for dest, flag in flags.items() if hasattr(args, dest) and dest not in own]
    stray += ["--json"] if args.json else []
    if stray:
        raise ConfigurationError(f"{', '.join(stray)}: for a tuning run, not for mneme tune {verb} "
                                 f"(mneme tune {verb} --help lists its flags)")


def _run_report(args: argparse.Namespace) -> int:
    directories = args.directories
    storage = getattr(args, "optuna_storage", None)
    if len(directories) > 1 or storage:  # several processes' runs, or a shared study
        from tuner.results.shared_report import report_command as merged_report

        return merged_report(directories, storage, getattr(args, "study_name", None),
                             getattr(args, "results_dir", None), sys.stdout)
    if not directories:
        raise ConfigurationError("give the results directories to report on (mneme tune report DIR [DIR...]) "
                                 "or a shared study's storage (--optuna-storage URL --study-name NAME)")
    from tuner.results.report import report_command

    return report_command(directories[0], sys.stdout)


def _run_compare(args: argparse.Namespace) -> int:
    from tuner.results.compare import compare_command

    return compare_command(args.first, args.second, sys.stdout)


def _run_export(args: argparse.Namespace) -> int:
    if args.csv is None:
        raise ConfigurationError("mneme tune export DIR needs a format: --csv [PATH] (the tuned-kernels "
                                 "export, proteus_tuned_kernels.json, is written by every run)")
    from tuner.results.flat import export_command

    return export_command(args.directory, args.csv or None, sys.stdout)


COMMANDS = [Command("tune", "tune a recorded kernel instance (subcommands: `tune report DIR`, `tune compare A B`, "
                    "`tune export DIR --csv`)", configure, run)]
