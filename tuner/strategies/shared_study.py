"""Shared Optuna studies: several ``mneme tune`` processes cooperating on one search.

Optuna's distributed optimization is processes that ask and tell trials of one
study held in a storage every process reaches: SQLite on one node, PostgreSQL
(or MySQL) across nodes, or Optuna's journal storage (an append-only file) on a
shared filesystem. :func:`open_storage` turns ``--optuna-storage`` into that
storage; :class:`SharedStudyStrategy` samples through it and adds what a tuner
needs on top:

* **A configuration is replayed once in the whole study.** Two trials whose
  parameters derive the same configuration (same grounded hash) are duplicates.
  Every trial is tagged with its hash (system attribute ``mneme:hash``) right
  after it is asked; the trial that evaluates a hash is its *claim*: the
  lowest-numbered trial tagged with it that is not itself a duplicate and was
  not released (a ``FAIL`` without a ``status``: its process stopped). A process decides only after every lower-numbered running trial is
  tagged (a trial is tagged microseconds after it is created; after
  ``TAG_WAIT_S`` an untagged one is taken as abandoned), so two processes can
  never both own one hash: the higher-numbered trial always sees the lower
  one's tag. A duplicate is told its claim's outcome once it is in the study
  (its values, or ``FAIL`` for a configuration that failed: the claim's own
  state is ``FAIL`` with its ``status``); ``mneme:duplicate_of`` names the claim.
* **Results are readable where Optuna's tools read them.** Each evaluated trial
  carries user attributes ``status``, ``speedup``, ``configuration`` and ``mneme``
  (``metric``, ``hash``, ``error``, ``worker`` host:pid, ``results_dir``), so
  ``optuna-dashboard STORAGE`` shows them beside the parameters and values.
* **Ctrl-C leaves the study clean.** :meth:`SharedStudyStrategy.close` fails the
  process's trials still running, which releases their claims: another process
  (or this one after ``--resume``) can take those configurations.

A process killed outright (SIGKILL) leaves its running trials' claims held;
their duplicates wait, and ``mneme tune report --optuna-storage`` lists them as
running.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from mneme.errors import ConfigurationError
from tuner.space.search_space import Candidate, SearchSpace
from tuner.strategies.sample_strategy import DUPLICATE_ATTR, FAILED, PRUNED, OptunaSamplingStrategy

log = logging.getLogger("mneme.tune.shared")

HASH_ATTR = "mneme:hash"
__all__ = ["DUPLICATE_ATTR", "HASH_ATTR", "SharedStudyStrategy", "open_storage"]
#: How long a process waits for a lower-numbered running trial to be tagged before taking it as abandoned.
TAG_WAIT_S = 10.0
SCHEMA_ATTEMPTS = 5
STORAGE_FORMS = "sqlite:///PATH, postgresql://USER@HOST/DB, mysql://..., or journal:PATH"


def open_storage(url: str) -> Any:
    """The Optuna storage of ``--optuna-storage URL``.

    ``journal:PATH`` is Optuna's JournalStorage over a file (locks that work on
    NFS and Lustre); an RDB URL is an RDBStorage, SQLite with a long lock
    timeout so that processes queue instead of failing with "database is locked".
    """
    import optuna

    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"--optuna-storage {url!r}: give {STORAGE_FORMS}")
    if url.startswith("journal:"):

        path = Path(url[len("journal:"):]).expanduser()
        if not str(path) or not path.parent.is_dir():
            raise ConfigurationError(f"--optuna-storage {url}: the directory {path.parent} does not exist; "
                                     "create it (on a filesystem every tuner reaches)")
        return _journal_storage(str(path))
    scheme = url.split(":", 1)[0].split("+", 1)[0]
    if scheme == "sqlite":
        engine = {"connect_args": {"timeout": 120}}
    elif scheme in ("postgresql", "postgres", "mysql"):
        engine = {"pool_pre_ping": True}
        url = _with_postgres_driver(url)
    else:
        raise ConfigurationError(f"--optuna-storage {url!r}: unknown storage; give {STORAGE_FORMS}")
    import sqlalchemy.exc

    for attempt in range(SCHEMA_ATTEMPTS):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine)
        except ImportError as exc:
            raise ConfigurationError(f"--optuna-storage {url}: the database driver is missing ({exc}); "
                                     "install psycopg2-binary (PostgreSQL) or PyMySQL (MySQL)") from None
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError):
            # Processes starting together race to create a new database's tables; the losers see them next time.
            if attempt == SCHEMA_ATTEMPTS - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _record_lock(path: str) -> Any:
    """A blocking POSIX record lock (``fcntl.lockf``) for the journal file.

    Optuna's own journal locks create a file and, while another process holds it, poll with sleeps
    that double up to a second: two tuners appending a dozen records per trial each then spent most of
    their time asleep (measured: two processes together at half one process's rate). ``lockf`` waits in
    the kernel and wakes at the release; it works on local filesystems and on NFS (through the lock
    manager) and Lustre mounted with ``flock``/``localflock``.
    """
    import fcntl

    try:
        from optuna.storages.journal._file import BaseJournalFileLock
    except ImportError:  # the backend only calls acquire() and release()
        BaseJournalFileLock = object

    class RecordLock(BaseJournalFileLock):
        def __init__(self) -> None:
            self._fd: int | None = None

        def acquire(self) -> bool:
            fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            return True

        def release(self) -> None:
            fd, self._fd = self._fd, None
            if fd is not None:
                fcntl.lockf(fd, fcntl.LOCK_UN)
                os.close(fd)

    return RecordLock()


#: How often a journal file is forced to disk (``fsync``), at most: see ``_journal_storage``.
JOURNAL_FSYNC_INTERVAL_S = 1.0


def _journal_storage(path: str) -> Any:
    """Optuna's JournalStorage over the file ``path``, at a small cost per trial.

    Optuna's file backend forces every append to disk (``fsync``, under the file lock): a trial is ~9
    appends (create, its parameters, the hash tag, user attributes, tell), so one tuner spent most of
    its time in ``fsync`` (~72% of a shared-study run's wall time measured; 240 trials/s for one
    process against 16 servers that give thousands of results a second). Two changes:

    * each append is written and flushed under the lock and closed, which is what makes it visible to
      the other processes (on one node through the page cache; NFS flushes on close, Lustre is
      coherent); it is forced to disk at most every ``JOURNAL_FSYNC_INTERVAL_S`` and when the tuner
      closes the study (``sync``). A machine that crashes can lose the last second of appends, whose
      trials ``--resume`` replays again (``trials.jsonl`` is the tuner's own record of them);
    * a trial's user attributes go in one append, not one each (``set_trial_user_attrs``).
    """
    import json

    from optuna.storages.journal import JournalFileBackend, JournalStorage
    from optuna.storages.journal._file import get_lock_file
    from optuna.storages.journal._storage import JournalOperation

    class JournalFile(JournalFileBackend):
        _synced = 0.0

        def append_logs(self, logs: list[dict[str, Any]]) -> None:
            text = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode("utf-8")
            with get_lock_file(self._lock):
                with open(self._file_path, "ab") as f:
                    f.write(text)
                    f.flush()
                    now = time.monotonic()
                    if now - self._synced >= JOURNAL_FSYNC_INTERVAL_S:
                        os.fsync(f.fileno())
                        self._synced = now

        def sync(self) -> None:
            with open(self._file_path, "ab") as f:
                os.fsync(f.fileno())

    class Journal(JournalStorage):
        def set_trial_user_attrs(self, trial_id: int, attrs: dict[str, Any]) -> None:
            """``set_trial_user_attr`` of each of ``attrs``, in one append."""
            with self._thread_lock:
                worker = self._replay_result.worker_id
                self._backend.append_logs([{"op_code": JournalOperation.SET_TRIAL_USER_ATTR, "worker_id": worker,
                                            "trial_id": trial_id, "user_attr": {name: value}}
                                           for name, value in attrs.items()])
                self._sync_with_backend()

        def sync(self) -> None:
            self._backend.sync()

    return Journal(JournalFile(path, lock_obj=_record_lock(path)))


def _with_postgres_driver(url: str) -> str:
    """``postgresql://`` names no driver, and SQLAlchemy's default changed (psycopg2 until 2.0, psycopg 3
    since 2.1): use whichever is installed."""
    import importlib.util

    head, sep, rest = url.partition("://")
    if head not in ("postgresql", "postgres") or not sep:
        return url
    for module, driver in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return f"postgresql+{driver}://{rest}"
    raise ConfigurationError(f"--optuna-storage {url}: no PostgreSQL driver is installed; pip install psycopg2-binary")


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class SharedStudyStrategy(OptunaSamplingStrategy):
    """:class:`OptunaSamplingStrategy` on a storage other processes share, with study-wide claims."""

    def __init__(self, space: SearchSpace, sampler: str = "tpe", *, storage: Any, results_dir: str = "",
                 **options: Any) -> None:
        store = open_storage(storage) if isinstance(storage, str) else storage
        super().__init__(space, sampler, storage=store, **options)
        self._storage = self.study._storage
        self._study_id = self.study._study_id
        self._foreign: dict[str, int] = {}  # hash -> number of the other process's trial that owns it
        self._waiting: dict[str, list[Any]] = {}  # hash -> our duplicate trials waiting for that owner
        self._running_elsewhere: set[str] = set()  # hashes other processes are evaluating
        self._scanned = 0  # trials 0.._scanned-1 have been looked at
        self._open: set[int] = set()  # numbers of trials not seen finished (or not seen tagged) yet
        self._claims: dict[str, set[int]] = {}  # hash -> tagged, non-duplicate, not failed trials
        self._trial_list: list[Any] = []
        self.results_dir = results_dir
        self.worker = worker_name()
        self.skipped_elsewhere = 0
        self._untagged_ok: set[int] = set()  # untagged trials taken as abandoned

    # -- what the study knows ------------------------------------------------------------
    def _is_known(self, key: str) -> bool:
        return key in self._values or key in self._in_flight or key in self._running_elsewhere

    def _distinct_seen(self) -> int:
        return len(self._values.keys() | self._in_flight.keys() | self._running_elsewhere)

    def _sync(self) -> None:
        """Catch up with the study: other processes' new, tagged and finished trials (incremental: only
        trials not seen finished are looked at again), and duplicates whose claim ended."""
        import optuna

        running, complete, pruned = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.COMPLETE,
                                     optuna.trial.TrialState.PRUNED)
        trials = self._storage.get_all_trials(self._study_id, deepcopy=False)
        if any(t.number != i for i, t in zip(range(self._scanned, len(trials)), trials[self._scanned:])):
            raise AssertionError("the storage returned the study's trials out of order")
        self._open.update(range(self._scanned, len(trials)))
        self._scanned = len(trials)
        self._trial_list = trials
        elsewhere = set()
        for number in sorted(self._open):
            t = trials[number]
            key = t.system_attrs.get(HASH_ATTR)
            duplicate = DUPLICATE_ATTR in t.system_attrs
            if key is not None and not duplicate:
                self._claims.setdefault(key, set()).add(number)
            elif key is not None:
                self._claims.get(key, set()).discard(number)
            if t.state == running or t.state == optuna.trial.TrialState.WAITING:
                if key is not None and not duplicate and key not in self._in_flight:
                    elsewhere.add(key)
                continue
            self._open.discard(number)  # finished: its outcome does not change any more
            if key is None or duplicate:
                continue
            if t.state == complete and t.values is not None:
                self._values.setdefault(key, tuple(t.values))
            elif t.state == pruned:
                self._values.setdefault(key, PRUNED)
            elif "status" in t.user_attrs:  # evaluated, and the configuration failed
                self._values.setdefault(key, FAILED)
                self._failed.setdefault(key, str(t.user_attrs["status"]))
            else:  # failed without an outcome (its process stopped): its claim is released
                self._claims[key].discard(number)
                continue
            self._claim_of.setdefault(key, number)
        self._running_elsewhere = elsewhere - self._values.keys()
        for key, owner in list(self._foreign.items()):
            if owner in self._open:
                continue
            del self._foreign[key]
            waiting = self._waiting.pop(key, [])
            if key in self._values:
                for trial in waiting:
                    self._tell_known(trial, key)
            else:  # the claim was released (its process stopped): the configuration is free again
                for trial in waiting:
                    self.study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def _owner(self, number: int, key: str) -> int:
        """The number of the trial that evaluates ``key``, as seen by trial ``number`` (tagged with it)."""
        deadline = time.monotonic() + TAG_WAIT_S
        while True:
            self._sync()
            untagged = [n for n in self._open if n < number and n not in self._untagged_ok
                        and HASH_ATTR not in self._trial_list[n].system_attrs
                        and self._trial_list[n].state.name == "RUNNING"]
            if not untagged:
                break
            if time.monotonic() >= deadline:
                log.warning("trials %s stayed untagged for %gs: taken as abandoned", untagged, TAG_WAIT_S)
                self._untagged_ok.update(untagged)
                break
            time.sleep(0.002)
        lower = [n for n in self._claims.get(key, ()) if n < number]
        return min(lower) if lower else number

    # -- ask/tell ------------------------------------------------------------------------
    def ask(self) -> Candidate | None:
        self._sync()
        return super().ask()

    def _settled(self, trial: Any, candidate: Candidate) -> bool:
        """Also settled: a configuration another process claimed first (its values come through the study)."""
        key = candidate.hash
        self._storage.set_trial_system_attr(trial._trial_id, HASH_ATTR, key)
        if key in self._values or key in self._in_flight:
            return super()._settled(trial, candidate)
        owner = self._owner(trial.number, key)
        if owner == trial.number:
            return False
        self.skipped_elsewhere += 1
        self._duplicate(trial, owner)
        if key in self._values:  # the claim finished meanwhile
            self._tell_known(trial, key)
        else:
            self._foreign[key] = owner
            self._waiting.setdefault(key, []).append(trial)
        return True

    def _duplicate(self, trial: Any, owner: int) -> None:
        self.skipped_duplicates += 1
        self._mark_duplicate(trial, owner)

    def _attributes(self, candidate: Candidate, outcome: Any) -> dict[str, Any]:
        """Also which process evaluated the trial and where its results directory is."""
        attrs = super()._attributes(candidate, outcome)
        attrs["mneme"].update(worker=self.worker, results_dir=self.results_dir)
        return attrs

    def _set_user_attrs(self, trial: Any, attrs: dict[str, Any]) -> None:
        """All in one append to a journal file, else one write each (each a transaction)."""
        set_all = getattr(self._storage, "set_trial_user_attrs", None)
        if set_all is not None:
            set_all(trial._trial_id, attrs)
            return
        super()._set_user_attrs(trial, attrs)

    def close(self) -> None:
        """Fail this process's trials still running (Ctrl-C, a stop): their configurations are free again."""
        import optuna

        leftover = list(self._trials.values())
        leftover += [t for waiting in self._in_flight.values() for t in waiting]
        leftover += [t for waiting in self._waiting.values() for t in waiting]
        self._trials.clear()
        self._in_flight.clear()
        self._waiting.clear()
        for trial in leftover:
            try:
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            except Exception as exc:  # noqa: BLE001 - already finished, or the storage went away: say so
                log.warning("could not release trial %d: %s", trial.number, exc)
        sync = getattr(self._storage, "sync", None)
        if sync is not None:  # a journal file: its last appends on disk
            try:
                sync()
            except OSError as exc:
                log.warning("could not force the journal to disk: %s", exc)
