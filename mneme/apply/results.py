"""What a tuning run found, read back from its results directory (docs/tuning.md).

Only a configuration the run verified counts: ``best.json`` names it and
``trials.jsonl`` must hold the same configuration (by hash) with status
``verified``. Anything else is a clear error naming the directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mneme.errors import ConfigurationError
from mneme.model.experiment import ExperimentConfiguration

EXPORT_NAME = "proteus_tuned_kernels.json"


@dataclass(frozen=True)
class TunedKernel:
    """One tuned kernel instance: where its recording is and the verified configuration that won."""

    results_dir: Path
    kernel_name: str
    static_hash: str
    record_database: str
    record_id: str
    configuration: ExperimentConfiguration
    speedup: float | None
    exact: bool  # every region matched bit for bit (no tolerance was needed)
    driver_version: int | None = None  # of the machine that ran `mneme tune` (None: not recorded)


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigurationError(f"{path} is missing: give a results directory `mneme tune` wrote") from None
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{path} is not valid JSON ({exc}); rerun `mneme tune`") from None


def results_directory(path: str | Path) -> Path:
    """The results directory for ``path``: the directory itself, or the one holding its export file."""
    p = Path(path)
    if p.is_file() and p.name.endswith(".json") and (p.parent / "config.json").is_file():
        return p.parent
    if p.is_dir():
        return p
    if p.is_file():
        raise ConfigurationError(
            f"{p} is not inside a results directory (no config.json beside it); give the directory `mneme tune` wrote"
        )
    raise ConfigurationError(f"{p}: no such results directory")


def _verified_trial(run: Path, config_hash: str) -> dict[str, Any] | None:
    trials = run / "trials.jsonl"
    if not trials.is_file():
        return None
    for line in trials.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        if record.get("hash") == config_hash and record.get("status") == "verified":
            return record
    return None


def read_results(path: str | Path) -> TunedKernel:
    """The verified best of one tuning run (``path``: its directory or its export file)."""
    run = results_directory(path)
    config = _json(run / "config.json")
    best_doc = _json(run / "best.json")
    best = best_doc.get("best")
    if not best:
        raise ConfigurationError(
            f"{run}: the tuning run found no verified configuration ({best_doc.get('reason', 'no best')}); "
            "nothing to apply from it"
        )
    trial = _verified_trial(run, best.get("hash", ""))
    if trial is None:
        raise ConfigurationError(
            f"{run}: best.json names configuration {best.get('hash')}, which trials.jsonl does not hold as verified; "
            "the directory is inconsistent, rerun `mneme tune`"
        )
    database, record_id = config.get("record_database"), config.get("record_id")
    if not database or record_id is None:
        raise ConfigurationError(f"{run}/config.json names no record_database/record_id; rerun `mneme tune`")
    within = (trial.get("result") or {}).get("verified_within") or {}
    kernel = config.get("kernel") or {}
    device = config.get("device") or {}
    return TunedKernel(
        results_dir=run,
        kernel_name=str(kernel.get("name", "")),
        static_hash=str(kernel.get("static_hash", "")),
        record_database=str(database),
        record_id=str(record_id),
        configuration=ExperimentConfiguration.from_dict(best["configuration"]),
        speedup=best.get("speedup"),
        exact=all(entry.get("exact", False) for entry in within.values()),
        driver_version=device.get("driver_version"),
    )
