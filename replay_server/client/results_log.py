"""``results.jsonl``: the executor's line per result, and the futures that carry what was written.

One line per result (record, configuration and its hash, result, server, worker, attempts, time), each
``json.dumps`` of its record, built from the parts' texts. The lines of one dispatcher round go out in
one write, before their futures are set (a waiter finds its line written). A future
(``ReplayFuture``) carries the result's dict and JSON text as written, which ``mneme tune`` reuses for
``trials.jsonl`` instead of converting and encoding the result again.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from json.encoder import encode_basestring_ascii as _string
from pathlib import Path
from typing import Any, Iterable

from mneme.model.experiment import ExperimentConfiguration, ExperimentResult
from mneme.model.json_text import json_encoder

RESULTS_FILE = "results.jsonl"
_strict_json = json_encoder(allow_nan=False)  # a result's text, which the tuner may write again as it is


class ReplayFuture(Future):
    """The future of one configuration's ExperimentResult. When the executor writes ``results.jsonl``,
    it also carries the result as written there: ``result_dict`` (``result.to_dict()``) and
    ``result_json`` (its JSON text; None when it needed more than strict JSON, e.g. an infinity). A
    caller that records the result again (the tuner's ``trials.jsonl``) reuses them instead of
    converting and encoding it a second time."""

    result_dict: "dict[str, Any] | None" = None
    result_json: str | None = None


class ResultsLog:
    """``results.jsonl`` in one directory, appended to by one executor.

    Args:
        directory: where the file is (made when missing).
        record_db: the recording database every line names.
        record_id: the instance every line names.
    """

    def __init__(self, directory: str | Path, record_db: str, record_id: str) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / RESULTS_FILE
        self._head = json.dumps({"record_db": record_db, "record_id": record_id})[:-1]
        self._lock = threading.Lock()
        self._file: Any = None

    def line(self, future: ReplayFuture, config: ExperimentConfiguration, result: ExperimentResult, server: str,
             worker: str, attempts: int) -> str:
        """The line of one result; ``future`` gets the result's dict and text as written in it.

        Returns:
            ``json.dumps`` of the record (its keys in this order) and a newline.
        """
        future.result_dict = record = result.to_dict()
        try:
            future.result_json = text = _strict_json(record)
        except ValueError:  # an infinity or NaN: written as json.dumps writes it, not shared as strict JSON
            text = json.dumps(record)
        return (f'{self._head}, "config_hash": "{config.hash()}", "config": {config.to_json()}, '
                f'"result": {text}, "server": {_string(server)}, "worker": {_string(worker)}, '
                f'"attempts": {attempts}, "time": {time.time()!r}}}\n')

    def write(self, lines: Iterable[str]) -> None:
        """Append ``lines`` in one write (the file is opened on the first)."""
        with self._lock:
            if self._file is None:
                self._file = open(self.path, "a")
            self._file.write("".join(lines))
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
