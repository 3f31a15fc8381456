"""The results directory of a tuning run.

Layout (the reference's): ``config.json``, ``search_space.json``,
``baseline.json``, ``trials.jsonl`` (one JSON record per evaluated candidate,
appended as each result arrives and flushed after each batch of results that
came together, so a run stopped by Ctrl-C or SIGTERM loses nothing it
finished, and one killed outright at most the batch it was writing),
``best.json``, ``summary.json``, ``logs/tune.log`` (the run's events and a
progress line every ``tuner.loop.PROGRESS_SECONDS``, not a line per trial:
``trials.jsonl`` has those), and the tuned-kernels export. JSON files other
than ``trials.jsonl`` are replaced atomically (write a temporary file, then
rename).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from datetime import datetime, timezone
from json.encoder import encode_basestring_ascii as _string
from pathlib import Path
from typing import Any, Iterable

from mneme.errors import ConfigurationError
from mneme.model.json_text import json_encoder
from tuner.errors import cannot_write

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


_encode = json_encoder(allow_nan=False, default=str)  # dumps's settings, made once
_KEY_TEXT: dict[str, str] = {}  # a record key's text and separator, made once per key (trial records: ~15)


def dumps(value: Any, indent: int | None = None) -> str:
    try:  # the common case, without a walk of the whole value first
        if indent is None:
            return _encode(value)
        return json.dumps(value, indent=indent, allow_nan=False, default=str)
    except ValueError:  # an infinity or NaN somewhere
        return json.dumps(_json_safe(value), indent=indent, allow_nan=False, default=str)


def dumps_record(record: dict[str, Any], known: dict[str, str]) -> str:
    """``dumps(record)`` when the text of its large values is known (``known``: key -> that value's
    ``dumps`` text, e.g. the result the executor encoded for ``results.jsonl``): scalar values are
    written here, and json encodes the rest one by one. Half the cost of ``dumps`` for a trial record
    (written for every result). The caller vouches that each given text is what ``dumps`` makes of
    the value (strict JSON)."""
    parts: list[str] = []
    for key, value in record.items():
        head = _KEY_TEXT.get(key)
        if head is None:
            if type(key) is not str:  # json's own rules for other keys
                return dumps(record)
            head = _string(key) + ": "
            if len(_KEY_TEXT) < 256:
                _KEY_TEXT[key] = head
        text = known.get(key)
        if text is None:
            kind = type(value)
            if kind is str:
                text = _string(value)
            elif kind is int:
                text = int.__repr__(value)
            elif kind is bool:
                text = "true" if value else "false"
            elif value is None:
                text = "null"
            elif kind is float and math.isfinite(value):
                text = float.__repr__(value)
            else:
                try:
                    text = _encode(value)
                except ValueError:  # an infinity or NaN: dumps makes them null
                    return dumps(record)
        parts.append(head + text)
    return "{" + ", ".join(parts) + "}"


class ResultsDirectory:
    """Reads and writes one run's directory. Every failed write raises
    :class:`~tuner.errors.ResultsDirectoryError` (``cannot write DIR: REASON``), never a bare ``OSError``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._trials_file = None

    @contextlib.contextmanager
    def _writing(self):
        """Turn an ``OSError`` of the block into ``cannot write DIR: REASON``."""
        try:
            yield
        except OSError as exc:
            raise cannot_write(self.path, exc) from exc

    # -- set-up --------------------------------------------------------------
    def holds_run(self) -> bool:
        """True when the directory holds trials of a run (a new run must not write into it)."""
        trials = self.path / TRIALS
        return trials.is_file() and trials.stat().st_size > 0

    def check(self, resume: bool) -> None:
        """Before anything starts: the directory holds a run to resume (``resume``) or none, and can be
        written (it is created for a new run, and a file is written and removed in it)."""
        if resume:
            if not (self.path / "config.json").is_file():
                raise ConfigurationError(
                    f"--resume: {self.path} holds no tuning run (no config.json); check --results-dir"
                )
        elif self.holds_run():
            raise ConfigurationError(
                f"{self.path} already holds a tuning run; continue it with --resume, start a new one beside it "
                "with --force, or give another --results-dir"
            )
        check_writable(self.path)

    def prepare(self, resume: bool) -> None:
        """Create it for a new run, or check it holds a run to resume."""
        self.check(resume)
        with self._writing():
            (self.path / "logs").mkdir(parents=True, exist_ok=True)
            (self.path / TRIALS).touch()

    def open_log(self, logger: logging.Logger) -> logging.Handler:
        with self._writing():
            handler = logging.FileHandler(self.path / LOG, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        return handler

    # -- whole-file JSON -------------------------------------------------------
    def write_json(self, name: str, data: Any) -> Path:
        target = self.path / name
        with self._writing():
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
            with self._writing(), open(path, "r+b") as fh:
                fh.truncate(good_end)
        return records

    def append_trial(self, record: dict[str, Any], known: dict[str, str] | None = None) -> None:
        """One record (``known``: see :func:`dumps_record`); on disk at the next ``flush``."""
        with self._writing():
            if self._trials_file is None:
                self._trials_file = open(self.path / TRIALS, "a", encoding="utf-8")
            self._trials_file.write((dumps_record(record, known) if known else dumps(record)) + "\n")

    def flush(self) -> None:
        """The records appended so far go to the OS (after each batch of results: one write for all)."""
        if self._trials_file is not None:
            with self._writing():
                self._trials_file.flush()

    def close(self) -> None:
        trials, self._trials_file = self._trials_file, None
        if trials is not None:
            try:
                with self._writing():
                    trials.flush()
                    os.fsync(trials.fileno())
            finally:
                with contextlib.suppress(OSError):  # what could not be written is reported above
                    trials.close()


def check_writable(directory: str | Path) -> None:
    """Create ``directory`` (and its parents) and write and remove a file in it.

    Args:
        directory: the directory a command is about to write.

    Raises:
        ResultsDirectoryError: ``cannot write DIR: REASON`` (read-only file system, no permission, a file
            where a directory should be, no space or quota left).
    """
    path = Path(directory)
    probe = path / f".mneme-write-check-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with open(probe, "w") as fh:  # closed: where a full quota shows on network file systems
            fh.write("mneme\n")
        probe.unlink()
    except OSError as exc:
        with contextlib.suppress(OSError):
            probe.unlink()
        raise cannot_write(path, exc) from exc


def iter_verified(records: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    return (r for r in records if r.get("status") == "verified" and r.get("metric") is not None)
