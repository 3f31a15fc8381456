"""The results directory of a tuning run.

Layout (the reference's): ``config.json``, ``search_space.json``,
``baseline.json``, ``trials.jsonl`` (one JSON record per evaluated candidate,
appended and flushed as each result arrives, so an interrupted run loses
nothing it finished), ``best.json``, ``summary.json``, ``logs/tune.log``, and
the tuned-kernels export. JSON files other than ``trials.jsonl`` are replaced
atomically (write a temporary file, then rename).
"""

from __future__ import annotations

import json
import logging
import math
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from mneme.errors import ConfigurationError

TRIALS = "trials.jsonl"
LOG = "logs/tune.log"
DEFAULT_ROOT = "mneme-tune-results"


def default_results_dir(record_id: str | None, root: str | Path = DEFAULT_ROOT) -> Path:
    """A fresh timestamped directory under ``mneme-tune-results/``."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    suffix = f"-{str(record_id)[:16]}" if record_id else ""
    path = Path(root) / f"{stamp}{suffix}"
    n = 1
    while path.exists():
        n += 1
        path = Path(root) / f"{stamp}{suffix}-{n}"
    return path


def _json_safe(value: Any) -> Any:
    """Infinities and NaN become null: the files are strict JSON for every reader."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def dumps(value: Any, indent: int | None = None) -> str:
    try:  # the common case, without a walk of the whole value first
        return json.dumps(value, indent=indent, allow_nan=False, default=str)
    except ValueError:  # an infinity or NaN somewhere
        return json.dumps(_json_safe(value), indent=indent, allow_nan=False, default=str)


class ResultsDirectory:
    """Reads and writes one run's directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._trials_file = None

    # -- set-up --------------------------------------------------------------
    def prepare(self, resume: bool) -> None:
        """Create it for a new run, or check it holds a run to resume."""
        trials = self.path / TRIALS
        if resume:
            if not (self.path / "config.json").is_file():
                raise ConfigurationError(
                    f"--resume: {self.path} holds no tuning run (no config.json); check --results-dir"
                )
        elif trials.exists() and trials.stat().st_size > 0:
            raise ConfigurationError(
                f"{self.path} already holds a tuning run; continue it with --resume, or give another --results-dir"
            )
        (self.path / "logs").mkdir(parents=True, exist_ok=True)
        trials.touch()

    def open_log(self, logger: logging.Logger) -> logging.Handler:
        handler = logging.FileHandler(self.path / LOG, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        return handler

    # -- whole-file JSON -------------------------------------------------------
    def write_json(self, name: str, data: Any) -> Path:
        target = self.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(dumps(data, indent=2) + "\n")
        os.replace(tmp, target)
        return target

    def read_json(self, name: str) -> Any:
        target = self.path / name
        try:
            return json.loads(target.read_text())
        except FileNotFoundError:
            return None
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"{target} is not valid JSON ({exc}); delete it or start a new run") from None

    # -- trials ----------------------------------------------------------------
    def load_trials(self) -> list[dict[str, Any]]:
        """Every complete record of ``trials.jsonl``.

        A run killed mid-write can leave a partial last line; it is cut off so
        the next append starts on a fresh line.
        """
        path = self.path / TRIALS
        if not path.exists():
            return []
        data = path.read_bytes()
        records: list[dict[str, Any]] = []
        good_end = 0
        offset = 0
        for line in data.splitlines(keepends=True):
            offset += len(line)
            if not line.endswith(b"\n"):
                break
            text = line.strip()
            if text:
                try:
                    record = json.loads(text)
                except json.JSONDecodeError:
                    raise ConfigurationError(
                        f"{path} has a corrupt record at byte {offset - len(line)}; fix or remove that line"
                    ) from None
                if not isinstance(record, dict):
                    raise ConfigurationError(f"{path} has a record that is not an object at byte {offset - len(line)}")
                records.append(record)
            good_end = offset
        if good_end < len(data):
            with open(path, "r+b") as fh:
                fh.truncate(good_end)
        return records

    def append_trial(self, record: dict[str, Any]) -> None:
        if self._trials_file is None:
            self._trials_file = open(self.path / TRIALS, "a", encoding="utf-8")
        self._trials_file.write(dumps(record) + "\n")
        self._trials_file.flush()

    def close(self) -> None:
        if self._trials_file is not None:
            self._trials_file.flush()
            os.fsync(self._trials_file.fileno())
            self._trials_file.close()
            self._trials_file = None


def iter_verified(records: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    return (r for r in records if r.get("status") == "verified" and r.get("metric") is not None)
