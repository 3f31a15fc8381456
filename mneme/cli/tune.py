"""`mneme tune`: tune a recorded kernel instance; `mneme tune report DIR`: plot a run; `mneme tune compare A B`:
two runs side by side; `mneme tune export DIR --csv`: a run's trials as a table."""

from __future__ import annotations

import argparse

from mneme.cli.command import Command
from mneme.errors import ConfigurationError


def configure(parser: argparse.ArgumentParser) -> None:
    from tuner.cli_args import add_arguments

    add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    given = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    action = given.pop("action", []) or []
    csv = given.pop("csv", None)
    if action:
        return _results_action(action, given, csv)
    if csv is not None:
        raise ConfigurationError("--csv goes with `mneme tune export DIR --csv [PATH]`")
    from tuner.options import resolve_options
    from tuner.resume import resume_settings
    from tuner.run import run_tune

    config_file = given.pop("config", None)
    base = resume_settings(given["results_dir"]) if given.get("resume") and given.get("results_dir") else None
    return run_tune(resolve_options(given, config_file, base))


def _results_action(action: list[str], given: dict, csv: str | None) -> int:
    """``tune report``, ``tune compare`` and ``tune export``: commands on results directories (their logic
    is in tuner.results, callable from any parser)."""
    import sys

    storage = given.get("optuna_storage")
    verb, operands = action[0], action[1:]
    if verb == "report" and (len(operands) > 1 or storage):  # several processes' runs, or a shared study
        from tuner.results.shared_report import report_command as merged_report

        return merged_report(operands, storage, given.get("study_name"), given.get("results_dir"), sys.stdout)
    if verb == "report" and len(operands) == 1:
        from tuner.results.report import report_command

        return report_command(operands[0], sys.stdout)
    if verb == "compare" and len(operands) == 2:
        from tuner.results.compare import compare_command

        return compare_command(operands[0], operands[1], sys.stdout)
    if verb == "export" and len(operands) == 1:
        if csv is None:
            raise ConfigurationError("mneme tune export DIR needs a format: --csv [PATH] (the tuned-kernels "
                                     "export, proteus_tuned_kernels.json, is written by every run)")
        from tuner.results.flat import export_command

        return export_command(operands[0], csv or None, sys.stdout)
    raise ConfigurationError(
        f"unexpected arguments {' '.join(action)!r}; did you mean `mneme tune report DIR [DIR...]` "
        "(or `mneme tune report --optuna-storage URL --study-name NAME`), `mneme tune compare A B` or "
        "`mneme tune export DIR --csv`?"
    )


COMMANDS = [Command("tune", "tune a recorded kernel instance (or `tune report DIR`, `tune compare A B`, "
                    "`tune export DIR --csv`)", configure, run)]
