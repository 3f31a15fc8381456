"""The core process of ``mneme study-server --fronts N``: the one place that changes the study.

The fronts (``tuner.study_fronts``) parse the tuners' calls and encode their answers; the core decides.
A batch of a tuner's changes (``Apply``) reaches it as journal logs the front made (each with its line of
the journal file), which the core checks against its :class:`~tuner.study_replica.StudyReplica` (Optuna's
rules, a few microseconds a log), writes, and answers; the claims of configuration hashes are decided
here. Optuna's other methods run on Optuna's journal storage over the same journal, which takes the
core's logs in when one of its methods runs next. Each answer carries the logs written since the front's
last call, so that each front's replica has every change its tuners were told of; reads (``Changes``)
are answered by the fronts from their replicas.

Wire form over a front's pipe: a call is ``METHOD`` ``\\n`` ``PAYLOAD`` (``APPLY``: a marshalled
``(tolerate, entries)``; ``SYNC``: nothing; else an Optuna method's path and request bytes); the answer is
a marshalled ``(status, body, chunks)``: status 0 and the body (the results of ``APPLY``, the response bytes
of an Optuna method), or status 1 and ``(code name, details)``; chunks: the logs written since the front's
last call, each chunk a marshalled list.
"""

from __future__ import annotations

import json
import logging
import marshal
import uuid
from pathlib import Path
from typing import Any

from mneme._internal.heap import Heap
from tuner.study_json import encode as _encode  # the journal's lines
from tuner.study_replica import FAIL, SET_TRIAL_SYSTEM_ATTR, WAITING, StudyReplica

log = logging.getLogger("mneme.study_server")

APPLY, SYNC = b"@apply", b"@sync"
OK, ABORTED = 0, 1
#: Chunks of logs kept for fronts behind the others before the list is trimmed.
CHUNKS_KEPT = 1024
_REFUSALS = {"KeyError": KeyError, "TypeError": TypeError, "ValueError": ValueError}


class StudyCore:
    """The study of one journal file, for ``count`` fronts.

    Args:
        path: the journal file (locked while the core runs; see ``tuner.study_journal.ServerJournal``).
        count: front processes that call :meth:`answer`.
    """

    def __init__(self, path: Path, count: int) -> None:
        from tuner.strategies.shared_study import _journal_storage
        from tuner.study_claims import Claims
        from tuner.study_journal import ServerJournal
        from tuner.study_methods import optuna_methods

        self.journal = ServerJournal(path)
        self.generation = uuid.uuid4().hex
        self.worker_id = f"{uuid.uuid4()}-study-server"  # the logs of the fronts' batches
        logs = self.journal.read_logs(0)
        self.replica = StudyReplica(full=False, generation=self.generation)
        self.replica.apply_all(logs)
        self.storage = _journal_storage(str(path), self.journal)  # Optuna's, for its methods
        self.claims = Claims(trials=_ReplicaTrials(self.replica))
        self._methods = optuna_methods(self.storage)
        self._ingested = len(logs)
        self._chunks: list[bytes] = [marshal.dumps(logs)] if logs else []
        self._positions: list[int | None] = [0] * count  # per front: the first chunk it has not had
        self._heap = Heap()  # (the study's logs stay: the collector looks only at what is new)

    def settings(self) -> dict[str, str]:
        """What a front needs to know of the core: the worker id of its logs, the generation of cursors, how many
        fronts there are."""
        return {"worker_id": self.worker_id, "generation": self.generation, "fronts": str(len(self._positions))}

    def flush(self) -> None:
        """The journal written out (before the answers go)."""
        self.journal.flush()

    def close(self) -> None:
        """The journal on disk and let go (and the heap: see ``mneme._internal.heap``)."""
        self._heap.release()
        self.storage.close()

    def gone(self, front: int) -> None:
        """Front ``front`` stopped: its chunks are not kept for it."""
        self._positions[front] = None

    # -- calls -------------------------------------------------------------------------------
    def answer(self, front: int, method: bytes, payload: bytes) -> bytes:
        """One call of front ``front`` (see the module's wire form)."""
        try:
            if method == APPLY:
                status, body = self._apply(payload)
            elif method == SYNC:
                status, body = OK, None
            else:
                status, body = self._optuna(method, payload)
        except Exception as exc:  # a bug of ours: the call fails, the server goes on
            log.exception("study server: %s failed", method.decode("utf-8", "replace"))
            status, body = ABORTED, ("INTERNAL", f"{type(exc).__name__}: {exc}")
        self._ingest()
        self._heap.settle()
        position = self._positions[front] or 0
        chunks = self._chunks[position:]
        self._positions[front] = len(self._chunks)
        if len(self._chunks) > CHUNKS_KEPT:
            self._trim()
        return marshal.dumps((status, body, chunks))

    def _trim(self) -> None:
        live = [p for p in self._positions if p is not None]
        low = min(live) if live else len(self._chunks)
        if low:
            del self._chunks[:low]
            self._positions = [None if p is None else p - low for p in self._positions]

    def _optuna(self, method: bytes, request: bytes) -> tuple[int, Any]:
        from tuner.study_methods import Aborted, SyncContext

        entry = self._methods.get(method.decode("utf-8", "replace"))
        if entry is None:
            return ABORTED, ("UNIMPLEMENTED", f"{method.decode('utf-8', 'replace')}: no such method")
        deserializer, function, serializer = entry
        try:
            return OK, serializer(function(deserializer(request), SyncContext()))
        except Aborted as exc:
            code, details = (exc.args + ("",))[:2]
            return ABORTED, (getattr(code, "name", str(code)), str(details))
        except ValueError as exc:  # a request that does not parse
            return ABORTED, ("INVALID_ARGUMENT", f"{type(exc).__name__}: {exc}")

    def _ingest(self) -> None:
        """Take in the logs Optuna's storage wrote (its methods): into the replica and the fronts' chunks."""
        logs = self.journal.read_logs(self._ingested)
        if not logs:
            return
        plain = [json.loads(_encode(entry)) for entry in logs]  # (enums as numbers: marshal takes them)
        self.journal.replace_logs(self._ingested, plain)
        self.replica.apply_all(plain)
        self._ingested += len(plain)
        self._chunks.append(marshal.dumps(plain))

    # -- a tuner's batch ---------------------------------------------------------------------
    def _apply(self, payload: bytes) -> tuple[int, Any]:
        from optuna.exceptions import UpdateFinishedTrialError

        tolerate, entries = marshal.loads(payload)
        written: list[dict[str, Any]] = []
        texts: list[bytes] = []
        results: list[Any] = []
        status, body = OK, results
        try:
            for kind, args, logs, text in entries:
                try:
                    results.append(self._entry(kind, args, logs, text, written, texts))
                except (KeyError, UpdateFinishedTrialError, TypeError, ValueError) as exc:
                    if len(results) < tolerate:  # a change the tuner kept for later: it learns, the rest goes on
                        results.append(("error", f"{type(exc).__name__}: {exc}"))
                        continue
                    code = ("NOT_FOUND" if isinstance(exc, KeyError) else
                            "FAILED_PRECONDITION" if isinstance(exc, UpdateFinishedTrialError) else
                            "INVALID_ARGUMENT")
                    status, body = ABORTED, (code, str(exc.args[0]) if isinstance(exc, KeyError) and exc.args
                                             else str(exc))
                    break
        finally:
            if written:
                self.journal.append_encoded(written, b"".join(texts))
                self._ingested += len(written)
                self._chunks.append(marshal.dumps(written))
        return status, body

    def _entry(self, kind: str, args: tuple, logs: list[dict[str, Any]], text: bytes,
               written: list[dict[str, Any]], texts: list[bytes]) -> Any:
        replica = self.replica
        if kind == "invalid":
            raise _REFUSALS.get(args[0], ValueError)(args[1])
        if kind == "create":
            trial_id = replica.apply(logs[0], True)
            written.append(logs[0])
            texts.append(text)
            return (trial_id, replica.number[trial_id])
        if kind == "state":
            changed = replica.apply(logs[0], True)
            if changed:
                written.append(logs[0])
                texts.append(text)
            return changed
        if kind == "claim":
            study_id, trial_id, key = args
            replica.apply(logs[0], True)
            written.append(logs[0])
            texts.append(text)
            owner = self.claims.decide(study_id, trial_id, key)
            if owner == trial_id:
                return replica.number[trial_id]
            from tuner.strategies.shared_study import DUPLICATE_ATTR

            number = replica.number[owner]
            mark = {"op_code": SET_TRIAL_SYSTEM_ATTR, "worker_id": self.worker_id, "trial_id": trial_id,
                    "system_attr": {DUPLICATE_ATTR: number}}
            replica.apply(mark, True)
            written.append(mark)
            texts.append((_encode(mark) + "\n").encode("utf-8"))
            return number
        for entry in logs:  # a parameter, attributes: the logs of one trial (all apply, or the first fails)
            replica.apply(entry, True)
        written.extend(logs)
        texts.append(text)
        return None


class _ReplicaTrials:
    """What :class:`~tuner.study_claims.Claims` reads of a study, from the core's replica."""

    def __init__(self, replica: StudyReplica) -> None:
        self.replica = replica

    def existing(self, study_id: int) -> dict[str, int]:
        replica = self.replica
        owners: dict[str, int] = {}
        for trial_id in replica.study_trials(study_id):  # by number
            key = replica.tags.get(trial_id)
            if key is None or replica.state[trial_id] == WAITING or trial_id in replica.duplicates:
                continue
            if not self.released(trial_id):
                owners.setdefault(key, trial_id)
        return owners

    def released(self, trial_id: int) -> bool:
        return self.replica.state[trial_id] == FAIL and trial_id not in self.replica.with_status
