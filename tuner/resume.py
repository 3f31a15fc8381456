"""``--resume`` and ``--force``: which results directory a run writes, and whether the run already in it
may be continued.

``mneme tune --resume --results-dir DIR`` needs nothing else: the settings come from ``DIR/config.json``
(:func:`resume_settings`), under any flag given beside them. A resume is refused when the run's
fingerprint (:mod:`tuner.results.fingerprint`) differs from the one in ``DIR``, naming what differs; the
settings are compared before any server starts (:func:`choose_results_dir`), the kernel and the search
space once the recording is read (:func:`check_resumable`). ``--force`` starts a new run in a directory
beside ``DIR`` instead (``DIR-2``, ``DIR-3``, ...), as it does for a new run pointed at a directory that
holds one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from mneme.errors import ConfigurationError
from tuner.options import TuneOptions, load_config_file
from tuner.preflight import check_results_location
from tuner.results.directory import ResultsDirectory, check_writable
from tuner.results.fingerprint import differences, run_fingerprint, settings_fingerprint, stored_fingerprint

#: Settings of ``config.json`` that say how that run was started, not what it measured: a resume does not
#: take them over.
RUN_MODES = ("resume", "force", "rerun_baseline", "print_space", "dry_run", "baseline_only", "dump_config",
             "results_dir", "quiet")


def resume_settings(results_dir: str | Path) -> dict[str, Any]:
    """The settings of the run in ``results_dir`` (its ``config.json``) as the bottom layer of a resume's
    settings; empty when it holds no ``config.json`` (the resume is refused later, saying so).

    Args:
        results_dir: ``--results-dir`` of the resume.

    Returns:
        The settings, without the run modes (``RUN_MODES``).
    """
    path = Path(results_dir) / "config.json"
    if not path.is_file():
        return {}
    return {k: v for k, v in load_config_file(path).items() if k not in RUN_MODES}


def beside(path: Path) -> Path:
    """Where ``--force`` puts a new run.

    Args:
        path: the results directory that holds another run.

    Returns:
        The first of ``DIR-2``, ``DIR-3``, ... that does not exist.
    """
    n = 2
    while path.with_name(f"{path.name}-{n}").exists():
        n += 1
    return path.with_name(f"{path.name}-{n}")


def _moved(options: TuneOptions, why: str) -> tuple[TuneOptions, str]:
    """``--force``: a new run in a directory beside the one given."""
    old = Path(str(options.results_dir))
    new = beside(old)
    check_writable(new)
    moved = dataclasses.replace(options, results_dir=str(new), resume=False, rerun_baseline=False)
    return moved, f"--force: {old} {why}; starting a new run in {new}"


def _refusal(path: Path, lines: list[str]) -> ConfigurationError:
    shown = "; ".join(lines[:12]) + (f"; and {len(lines) - 12} more" if len(lines) > 12 else "")
    return ConfigurationError(
        f"--resume: {path} holds a run whose trials mean something else ({shown}); resume it with its own "
        f"settings (`mneme tune --resume --results-dir {path}` reads them from its config.json), or give "
        "--force to start a new run beside it")


def choose_results_dir(options: TuneOptions) -> tuple[TuneOptions, str]:
    """Before any server starts: the results directory can be written and holds what the run expects; a
    resume's settings agree with the run in it.

    Args:
        options: the resolved settings.

    Returns:
        The settings (with another ``results_dir`` and no ``resume`` where ``--force`` moved the run) and
        what was moved and why ("" when nothing was).

    Raises:
        ConfigurationError: a directory that holds a run without ``--resume`` or ``--force``, none with
            ``--resume``, or one whose settings differ (each difference named).
        ResultsDirectoryError: a directory that cannot be written.
    """
    if options.results_dir is not None:
        directory = ResultsDirectory(options.results_dir)
        if options.resume and (directory.path / "config.json").is_file():
            stored = stored_fingerprint(directory.read_json("config.json") or {}, None)
            lines = differences(stored, settings_fingerprint(options.to_dict()))
            if lines and options.force:
                return _moved(options, "holds a run with other settings (" + "; ".join(lines) + ")")
            if lines:
                raise _refusal(directory.path, lines)
        elif not options.resume and options.force and directory.holds_run():
            return _moved(options, "already holds a run")
    check_results_location(options.results_dir, options.resume)
    return options, ""


def check_resumable(options: TuneOptions, kernel: Mapping[str, Any],
                    space: Mapping[str, Any]) -> tuple[TuneOptions, str]:
    """Once the recording is read and the space built: the kernel and the space of a resume agree with the
    run in its directory (:func:`choose_results_dir` compared the settings).

    Args:
        options: the resolved settings (``resume`` set).
        kernel: the kernel identity.
        space: the search space's description.

    Returns:
        As :func:`choose_results_dir`.

    Raises:
        ConfigurationError: the kernel or the search space differs (without ``--force``).
    """
    directory = ResultsDirectory(str(options.results_dir))
    stored = stored_fingerprint(directory.read_json("config.json") or {}, directory.read_json("search_space.json"))
    lines = differences(stored, run_fingerprint(options.to_dict(), kernel, space))
    if lines and options.force:
        return _moved(options, "holds a run of another kernel or search space (" + "; ".join(lines) + ")")
    if lines:
        raise _refusal(directory.path, lines)
    return options, ""
