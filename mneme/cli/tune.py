"""`mneme tune`: tune a recorded kernel instance; `mneme tune report DIR`: plot a run."""

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
    if action:
        storage = given.get("optuna_storage")
        if action[0] != "report" or (len(action) < 2 and not storage):
            raise ConfigurationError(
                f"unexpected arguments {' '.join(action)!r}; did you mean `mneme tune report DIR [DIR...]` "
                "(or `mneme tune report --optuna-storage URL --study-name NAME`)?"
            )
        if len(action) > 2 or storage:  # several processes' runs, or a shared study: one merged view
            import sys

            from tuner.results.shared_report import report_command

            return report_command(action[1:], storage, given.get("study_name"), given.get("results_dir"), sys.stdout)
        from tuner.results.report import write_report

        summary = write_report(action[1])
        for path in summary["written"]:
            print(f"wrote {path}")
        for note in summary["skipped"]:
            print(f"skipped {note}")
        policies = (summary.get("tolerance") or {}).get("policies") or {}
        bounds = ", ".join(f"{label}={spec}" for label, spec in policies.items()) or "none needed (bit-exact)"
        print(f"verified: {summary['verified_exact']} exactly, {summary['verified_within_tolerance']} within "
              f"tolerance; derived tolerance: {bounds}")
        return 0
    from tuner.options import resolve_options
    from tuner.resume import resume_settings
    from tuner.run import run_tune

    config_file = given.pop("config", None)
    base = resume_settings(given["results_dir"]) if given.get("resume") and given.get("results_dir") else None
    return run_tune(resolve_options(given, config_file, base))


COMMANDS = [Command("tune", "tune a recorded kernel instance (or `tune report DIR`: plot a run)", configure, run)]
