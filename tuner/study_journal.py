"""The journal file of one ``mneme study-server``: Optuna's journal storage with every log in memory."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from optuna.storages.journal import BaseJournalBackend

from mneme.errors import ConfigurationError
from tuner.study_json import encode as _encode  # the journal's lines
from tuner.study_replica import ATTR_FIELDS, TEXTS

log = logging.getLogger("mneme.study_server")

#: How often the server's journal file is forced to disk (``fsync``), at most.
JOURNAL_FSYNC_INTERVAL_S = 1.0


class ServerJournal(BaseJournalBackend):
    """A journal file only this server writes, behind Optuna's ``JournalStorage`` (a journal backend:
    ``read_logs``, ``append_logs``): every log is kept in memory, so the storage's look for new logs after
    each change, and before each read, costs no file access; appends go to the file held open and are
    written out (``flush``) before the server answers the call that made them, and forced to disk at most
    every ``JOURNAL_FSYNC_INTERVAL_S`` and at the end. The file is locked while the server runs: a second server
    (or another process locking it) is refused; tuners reach the study through the server, not the file.
    A last line cut short by a crash is dropped (with a warning) before the first append.
    """

    def __init__(self, path: Path) -> None:
        import fcntl

        try:
            self._file = open(path, "a+b")  # noqa: SIM115 - held open while the server runs
        except OSError as exc:
            raise ConfigurationError(f"mneme study-server: cannot open the journal {path}: {exc.strerror}; "
                                     "give a file this user can write") from None
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._file.close()
            raise ConfigurationError(f"mneme study-server: the journal {path} is locked by another process (another "
                                     "study server?); give each study server a file of its own") from None
        self._file.seek(0)
        data = self._file.read()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):
            log.warning("the journal %s ends in a line cut short (%d bytes): dropped", path, len(data) - complete)
            self._file.truncate(complete)
        self._logs: list[dict[str, Any]] = []
        for number, line in enumerate(data[:complete].splitlines(), start=1):
            if not line.strip():
                continue
            try:
                self._logs.append(json.loads(line))
            except ValueError:
                self._file.close()
                raise ConfigurationError(f"mneme study-server: the journal {path} is not a journal (line {number} is "
                                         "not JSON); give an Optuna journal file or a new one") from None
        self._synced = time.monotonic()

    def read_logs(self, log_number_from: int) -> list[dict[str, Any]]:
        """The logs from ``log_number_from`` on, whole: the attribute values a study server's front sent as their
        JSON only (``tuner.study_replica.TEXTS``) decoded (once)."""
        logs = self._logs[log_number_from:]
        for entry in logs:
            texts = entry.get(TEXTS)
            if texts is not None:
                field = ATTR_FIELDS.get(entry["op_code"])
                if field is not None and field not in entry:
                    entry[field] = {key: json.loads(text) for key, text in texts.items()}
        return logs

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        self._file.write("".join(_encode(entry) + "\n" for entry in logs).encode("utf-8"))  # (buffered)
        self._logs.extend(logs)

    def append_encoded(self, logs: list[dict[str, Any]], text: bytes) -> None:
        """Append ``logs`` whose lines are ``text`` already (a study server core's batches)."""
        self._file.write(text)
        self._logs.extend(logs)

    def replace_logs(self, start: int, logs: list[dict[str, Any]]) -> None:
        """Put ``logs`` in the place of those from ``start`` on (the same logs in plain types)."""
        self._logs[start:start + len(logs)] = logs

    def flush(self) -> None:
        """Write what was appended to the file (the server does before it answers a call: a crash of this
        process loses no change a tuner was told of); force it to disk at most every
        ``JOURNAL_FSYNC_INTERVAL_S``."""
        self._file.flush()
        now = time.monotonic()
        if now - self._synced >= JOURNAL_FSYNC_INTERVAL_S:
            os.fsync(self._file.fileno())
            self._synced = now

    def sync(self) -> None:
        """Force the file to disk."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """Force the file to disk and let it go (its lock with it)."""
        if not self._file.closed:
            self.sync()
            self._file.close()
