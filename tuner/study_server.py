"""``mneme study-server URL``: Optuna's gRPC storage proxy in front of one RDB storage.

Many tuner processes on one study each talk to the storage on every trial; a shared file or a
database they all open becomes their bottleneck. Optuna's storage proxy
(``optuna.storages.run_grpc_proxy_server``) holds the storage (SQLite on one node, PostgreSQL
across nodes) with Optuna's in-process cache in one process; tuners reach it with
``--optuna-storage grpc://HOST:PORT`` (``optuna.storages.GrpcStorageProxy``, which caches the
study's finished trials on its side too).

The proxy has no authentication: it listens on loopback unless told otherwise, and listening
beyond loopback needs ``--insecure`` (put it where only the tuners reach it: a Kubernetes
NetworkPolicy, a cluster's private network).
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

from mneme._internal.network import is_loopback
from mneme.errors import ConfigurationError
from tuner.study_claims import Claims
from tuner.study_methods import Aborted, SyncContext, optuna_methods

log = logging.getLogger("mneme.study_server")

DEFAULT_PORT = 13000
#: Front processes of a journal file's server (``bench/results/client_capacity.md``: two carried four tuners at
#: least as well as three or four on a 16-core host).
DEFAULT_FRONTS = 2
STORAGE_FORMS = "journal:PATH (a file of this server's), sqlite:///PATH or postgresql://USER@HOST/DB"


def open_proxied_storage(url: str) -> Any:
    """The storage the proxy serves.

    ``journal:PATH``: Optuna's journal storage over a file only this server writes (its operations cost
    tens of microseconds: the study lives in memory, each change is one append). An RDB URL: the RDB
    storage behind Optuna's in-process cache (each change is a transaction, about a millisecond or more);
    SQLite runs in WAL mode with ``synchronous=NORMAL`` (a commit is not forced to disk, a checkpoint is).
    A machine crash can lose the last second of changes either way, whose trials a tuner's ``--resume``
    replays.

    Args:
        url: ``journal:PATH``, ``sqlite:///PATH`` or ``postgresql://...`` (``mysql://`` works too).

    Returns:
        an ``optuna.storages.BaseStorage``.

    Raises:
        ConfigurationError: an unknown URL, or a database driver is missing.
    """
    import optuna

    from tuner.strategies.shared_study import open_storage

    scheme = url.split(":", 1)[0].split("+", 1)[0] if isinstance(url, str) else ""
    if scheme not in ("journal", "sqlite", "postgresql", "postgres", "mysql"):
        raise ConfigurationError(f"mneme study-server {url!r}: give {STORAGE_FORMS}")
    if scheme == "journal":
        from tuner.strategies.shared_study import _journal_storage
        from tuner.study_journal import ServerJournal

        path = _journal_path(url)
        return _journal_storage(str(path), ServerJournal(path))
    storage = open_storage(url)
    if scheme == "sqlite":
        _sqlite_wal(storage.engine)
    return optuna.storages.get_storage(storage)  # RDBStorage -> _CachedStorage(RDBStorage)


def _journal_path(url: str) -> Path:
    """The file of a ``journal:PATH`` URL (its directory must exist)."""
    path = Path(url[len("journal:"):]).expanduser()
    if not str(path) or not path.parent.is_dir():
        raise ConfigurationError(f"mneme study-server {url}: the directory {path.parent} does not exist; create it")
    return path


#: Parsed parameter distributions the server keeps (a study's parameters have one each, mostly).
DISTRIBUTIONS_KEPT = 4096

_TRIAL_WRITES = ("create_new_trial", "set_trial_param", "set_trial_state_values", "set_trial_intermediate_value",
                 "set_trial_user_attr", "set_trial_system_attr", "set_trial_user_attrs")


class ChangeLog:
    """The storage the proxy serves, with a log of which trial each change touched, so that a tuner fetches
    only the trials changed since its last look (``tuner.strategies.shared_study.CHANGES_METHOD``) instead of
    every unfinished trial each time (Optuna's client cache: with hundreds of trials in flight, every call
    carried them all). Everything else is the storage's own."""

    def __init__(self, storage: Any) -> None:
        import uuid

        self._storage = storage
        self._lock = threading.Lock()
        self._create_lock = threading.Lock()  # new trials go in the log in the order of their numbers
        self._log: list[tuple[int, int]] = []  # (study id, trial id) of each change, in order; a cursor is an index
        self._study_of: dict[int, int] = {t._trial_id: study._study_id for study in storage.get_all_studies()
                                          for t in storage.get_all_trials(study._study_id, deepcopy=False)}
        self.generation = uuid.uuid4().hex  # a cursor of another server (or run) is not this one's
        self._version: dict[int, int] = {}  # trial id -> the cursor after its last change
        self._encoded: dict[int, tuple[int, bytes]] = {}  # trial id -> (version, its Trial message), latest used
        self._encoded_lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._storage, name)
        if name not in _TRIAL_WRITES:
            return attribute

        def write(*args: Any, **kwargs: Any) -> Any:
            result = attribute(*args, **kwargs)
            with self._lock:
                if name == "create_new_trial":
                    trial_id = result
                    self._study_of[trial_id] = args[0] if args else kwargs["study_id"]
                else:
                    trial_id = args[0] if args else kwargs["trial_id"]
                self._log.append((self._study_of.get(trial_id, -1), trial_id))
                self._version[trial_id] = len(self._log)
            return result

        if name != "create_new_trial":
            return write

        def create(*args: Any, **kwargs: Any) -> Any:
            # One at a time (a database's threads would race): a tuner that sees trial N+1 sees trial N.
            with self._create_lock:
                return write(*args, **kwargs)

        return create

    def changes(self, study_id: int, since: int, generation: str) -> tuple[bytes, int]:
        """(Optuna's ``GetTrialsReply`` of the study's trials changed at or after cursor ``since``, or of all of
        them when ``generation`` is not this log's; the cursor to ask from next time). Each version of a trial
        is encoded once, whichever tuners ask for it (every tuner reads every trial's changes)."""
        from optuna.storages._grpc.servicer import _to_proto_trial

        from tuner.study_replica import ENCODED_TRIALS_KEPT, TRIAL_FIELD, varint

        with self._lock:
            cursor = len(self._log)
            fresh = generation == self.generation and 0 <= since <= cursor
            ids = {t for s, t in self._log[since:cursor] if s == study_id} if fresh else None
            versions = self._version if ids is None else {t: self._version.get(t, 0) for t in ids}
            versions = dict(versions)  # read before the trials: what is encoded is at least that version
        trials = (self._storage.get_all_trials(study_id, deepcopy=False) if ids is None else
                  [self._storage.get_trial(trial_id) for trial_id in ids])
        parts = []
        with self._encoded_lock:
            for trial in trials:
                version = versions.get(trial._trial_id, 0)
                cached = self._encoded.pop(trial._trial_id, None)
                if cached is None or cached[0] != version:
                    cached = (version, _to_proto_trial(trial).SerializeToString())
                self._encoded[trial._trial_id] = cached  # (popped and put back: the latest used last)
                parts.append(TRIAL_FIELD + varint(len(cached[1])) + cached[1])
            while len(self._encoded) > ENCODED_TRIALS_KEPT:
                del self._encoded[next(iter(self._encoded))]
        return b"".join(parts), cursor


def _batch_methods(storage: Any, claims: Claims) -> tuple[str, dict[str, tuple[Callable, Callable]]]:
    """mneme's additions to Optuna's service (``tuner.strategies.shared_study``'s ``APPLY_METHOD`` and
    ``CHANGES_METHOD``; JSON requests). ``Apply``: ``{"ops": [[NAME, ARGS...], ...]}`` runs a tuner's changes
    of its own trials in order (``create_new_trial`` STUDY, ``set_trial_param`` TRIAL NAME VALUE
    DISTRIBUTION_JSON, ``set_trial_system_attr`` TRIAL KEY VALUE, ``set_trial_user_attrs`` TRIAL {..},
    ``set_trial_state_values`` TRIAL STATE VALUES, ``claim`` STUDY TRIAL HASH) and answers
    ``{"results": [...]}``, one per operation; the first ``"tolerate": N`` operations (changes a tuner kept for
    later) answer a refusal as ``{"error": TEXT}`` and the rest go on, a later one's refusal fails the call; with ``"changes": {"study_id": S, "since": C, "generation": G}``
    in the request, the answer's ``"changes"`` holds what ``Changes`` would (``cursor``, ``generation``,
    ``trials``: the ``GetTrialsReply`` in base64), so that a trial's end brings the study's news back in the
    same round trip. ``Changes``: ``{"study_id": S, "since": C, "generation": G}`` -> a JSON head (cursor,
    generation) and Optuna's ``GetTrialsReply`` of the trials changed since C.
    Returns the service name and, per method, (function, response serializer)."""
    import base64

    import grpc
    from optuna.distributions import json_to_distribution
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    from tuner.strategies.shared_study import APPLY_METHOD, CHANGES_METHOD

    service = APPLY_METHOD.strip("/").split("/")[0]
    set_all = getattr(storage, "set_trial_user_attrs", None)

    def create(study_id: int) -> dict:
        trial_id = storage.create_new_trial(int(study_id))
        trial = storage.get_trial(trial_id)
        return {"trial_id": trial_id, "number": trial.number, "datetime_start": trial.datetime_start.isoformat()}

    def user_attrs(trial_id: int, attrs: dict) -> None:
        if set_all is not None:
            set_all(int(trial_id), dict(attrs))
        else:
            for name, value in dict(attrs).items():
                storage.set_trial_user_attr(int(trial_id), name, value)

    distributions: dict[str, Any] = {}  # a distribution's JSON -> the distribution (a study has a few)

    def distribution(text: str) -> Any:
        parsed = distributions.get(text)
        if parsed is None:
            parsed = json_to_distribution(text)
            if len(distributions) < DISTRIBUTIONS_KEPT:
                distributions[text] = parsed
        return parsed

    operations: dict[str, Callable[..., Any]] = {
        "create_new_trial": create,
        "set_trial_param": lambda t, name, value, dist: storage.set_trial_param(
            int(t), name, float(value), distribution(dist)),
        "set_trial_system_attr": lambda t, key, value: storage.set_trial_system_attr(int(t), key, value),
        "set_trial_user_attrs": user_attrs,
        "set_trial_state_values": lambda t, state, values: storage.set_trial_state_values(
            int(t), TrialState[state], values),
        "claim": lambda study, t, key: claims.claim(int(study), int(t), str(key)),
    }

    def apply(request: dict, context: Any) -> dict:
        try:
            ops = [(operations[op[0]], op[1:]) for op in request["ops"]]
        except (KeyError, TypeError, IndexError):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f'give {{"ops": [[NAME, ARGS...], ...]}} with NAME one of {", ".join(operations)}')
        tolerate = request.get("tolerate", 0) if isinstance(request.get("tolerate", 0), int) else 0
        results: list[Any] = []
        for function, args in ops:
            try:
                results.append(function(*args))
            except (KeyError, UpdateFinishedTrialError, TypeError, ValueError) as exc:
                if len(results) < tolerate:  # a change the tuner kept for later: it learns, the rest goes on
                    results.append({"error": f"{type(exc).__name__}: {exc}"})
                    continue
                code = (grpc.StatusCode.NOT_FOUND if isinstance(exc, KeyError) else
                        grpc.StatusCode.FAILED_PRECONDITION if isinstance(exc, UpdateFinishedTrialError) else
                        grpc.StatusCode.INVALID_ARGUMENT)
                context.abort(code, str(exc))
        if "changes" not in request:
            return {"results": results}
        cursor, reply = changed(request["changes"], context)
        return {"results": results, "changes": {"cursor": cursor, "generation": storage.generation,
                                                "trials": base64.b64encode(reply).decode("ascii")}}

    def changed(request: Any, context: Any) -> tuple[int, bytes]:
        """(the cursor, the ``GetTrialsReply`` of the trials changed since ``request``'s cursor)."""
        try:
            study_id, since, generation = int(request["study_id"]), int(request["since"]), str(request["generation"])
        except (KeyError, TypeError, ValueError):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, 'give {"study_id": S, "since": C, "generation": G}')
        try:
            reply, cursor = storage.changes(study_id, since, generation)
        except KeyError as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        return cursor, reply

    def changes(request: dict, context: Any) -> bytes:
        cursor, reply = changed(request, context)
        head = json.dumps({"cursor": cursor, "generation": storage.generation}).encode()
        return len(head).to_bytes(4, "big") + head + reply

    def name(method: str) -> str:
        return method.strip("/").split("/")[1]

    return service, {name(APPLY_METHOD): (apply, lambda o: json.dumps(o).encode()),
                     name(CHANGES_METHOD): (changes, bytes)}


def _is_journal(storage: Any) -> bool:
    from optuna.storages import JournalStorage

    return isinstance(storage, JournalStorage)


def _sqlite_wal(engine: Any) -> None:
    from sqlalchemy import event

    def pragmas(connection, _record) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    event.listen(engine, "connect", pragmas)
    engine.dispose()  # connections made before the listener get the pragmas when made anew


def _methods(storage: Any) -> dict[str, tuple[Callable[[bytes], Any], Callable[[Any, Any], Any], Callable[[Any], bytes]]]:
    """Optuna's ``StorageService`` and mneme's ``StudyBatch``: per method path (``/SERVICE/METHOD``), its request
    deserializer, its synchronous function (``(request, context)``; ``context.abort`` raises) and its response
    serializer."""
    methods = optuna_methods(storage)
    batch_service, batch = _batch_methods(storage, Claims(storage))
    methods.update({f"/{batch_service}/{name}": (json.loads, function, serialize)
                    for name, (function, serialize) in batch.items()})
    return methods


def _handlers(storage: Any, inline: bool, pool: ThreadPoolExecutor | None) -> list[Any]:
    """:func:`_methods` as ``grpc.aio`` handlers around their synchronous functions: run on the event loop's
    thread (``inline``: a journal file, whose operations take microseconds and which wants one thread) or in
    ``pool`` (a database). The asyncio server costs a fraction of the CPU per call of gRPC's threaded one,
    whose polling and hand-offs were most of this server's time."""
    import asyncio

    import grpc

    shim = SyncContext()
    written = getattr(storage._storage, "flush", None) if inline else None  # a journal file: written out

    def wrap(function: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        async def call(request: Any, context: Any) -> Any:
            try:
                if inline:
                    try:
                        return function(request, shim)
                    finally:
                        if written is not None:
                            written()  # before the answer: a tuner is never told of a change not in the file
                return await asyncio.get_running_loop().run_in_executor(pool, function, request, shim)
            except Aborted as exc:
                await context.abort(*exc.args)

        return call

    by_service: dict[str, dict[str, Any]] = {}
    for path, (deserializer, function, serializer) in _methods(storage).items():
        service, name = path.strip("/").split("/")
        by_service.setdefault(service, {})[name] = grpc.unary_unary_rpc_method_handler(
            wrap(function), request_deserializer=deserializer, response_serializer=serializer)
    return [grpc.method_handlers_generic_handler(service, methods) for service, methods in by_service.items()]


def serve(url: str, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, insecure: bool = False,
          threads: int = 16, announce: Callable[[str], None] = print, stop: threading.Event | None = None,
          fronts: int | None = None) -> int:
    """Serve ``url``'s storage until SIGTERM/SIGINT (or ``stop`` is set).

    Args:
        url: the storage (see :func:`open_proxied_storage`).
        host: listen address; beyond loopback only with ``insecure`` (the proxy has no authentication).
        port: listen port (0: a free one, printed).
        insecure: allow listening beyond loopback.
        threads: threads for a database's operations (a journal file's run on the server's one thread).
        announce: receives the one line saying where tuners connect.
        stop: an event that stops the server when set (tests; signals do the same).
        fronts: processes that serve gRPC and the tuners' reads in front of this one (``tuner.study_fronts``;
            a journal file only); 0: this process serves gRPC itself; None: ``DEFAULT_FRONTS`` for a journal
            file, else 0.

    Returns:
        0 after a clean stop.

    Raises:
        ConfigurationError: an address beyond loopback without ``insecure``, a bad URL, a port taken.
    """


    if not insecure and not is_loopback(host):
        raise ConfigurationError(
            f"--host {host}: Optuna's storage proxy has no authentication, so anyone who reaches the port could "
            "read and write the study; listen on 127.0.0.1, or pass --insecure where only the tuners reach it")
    warnings.filterwarnings("ignore", category=Warning, module="optuna")  # ExperimentalWarning of the proxy
    journal = isinstance(url, str) and url.startswith("journal:")
    if fronts is None:
        fronts = DEFAULT_FRONTS if journal else 0
    if fronts < 0:
        raise ConfigurationError(f"--fronts {fronts}: give 0 (no front processes) or more")
    if fronts and not journal:
        raise ConfigurationError(f"--fronts {fronts}: front processes serve a journal: URL only (a database's "
                                 "operations run on threads of this process); leave --fronts out")
    storage = None if fronts else ChangeLog(open_proxied_storage(url))
    inline = storage is None or _is_journal(storage._storage)  # a running trial belongs to the thread that made
    # it (Optuna #6084)
    pool = None if inline else ThreadPoolExecutor(max_workers=threads, thread_name_prefix="study")
    stop = stop or threading.Event()
    address = f"[{host.strip('[]')}]:{port}" if ":" in host.strip("[]") else f"{host}:{port}"
    shown = f"[{host.strip('[]')}]" if ":" in host.strip("[]") else host
    with _stopped_by_signals(stop):
        if fronts:
            return _serve_with_fronts(url, address, shown, fronts, announce, stop)
        return _serve_here(storage, inline, pool, url, address, shown, announce, stop)


@contextlib.contextmanager
def _stopped_by_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stop`` within the block (in the main thread; the handlers before come back)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, lambda *_: stop.set()) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _serve_here(storage: Any, inline: bool, pool: ThreadPoolExecutor | None, url: str, address: str, shown: str,
                announce: Callable[[str], None], stop: threading.Event) -> int:
    """:func:`serve` in this process alone (gRPC on an event loop here)."""
    import asyncio

    import grpc

    async def run() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(_handlers(storage, inline, pool))
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError:
            bound = 0
        if not bound:
            raise ConfigurationError(f"mneme study-server: cannot listen on {address}: the port is taken or the "
                                     "address is not this machine's; give another --port or --host")
        await server.start()
        announce(f"mneme study-server: serving {_redacted(url)} on {shown}:{bound} "
                 f"(tuners: --optuna-storage grpc://{shown}:{bound})")
        try:
            while not stop.is_set():
                await asyncio.sleep(0.2)
        finally:
            await server.stop(2.0)

    try:
        asyncio.run(run())
    finally:
        if pool is not None:
            pool.shutdown()
        close = getattr(storage._storage, "close", None) if inline else None
        if close is not None:  # the journal file: its last appends on disk, its lock let go
            close()
    return 0


def _serve_with_fronts(url: str, address: str, shown: str, count: int, announce: Callable[[str], None],
                       stop: threading.Event) -> int:
    """:func:`serve` with ``count`` front processes serving gRPC; this process is the core (``tuner.study_core``)."""
    from tuner.study_core import StudyCore
    from tuner.study_fronts import Fronts

    core = StudyCore(_journal_path(url), count)
    group = None
    try:
        group = Fronts(count, address, core.settings())
        announce(f"mneme study-server: serving {_redacted(url)} on {shown}:{group.port} with {count} front "
                 f"process(es) (tuners: --optuna-storage grpc://{shown}:{group.port})")
        if not group.serve(core.answer, stop, after=core.flush, gone=core.gone):  # (written before answered)
            log.error("mneme study-server: every front process is gone; stopping (start the server again: the "
                      "journal %s holds the study)", url)
            return 2
    finally:
        if group is not None:
            group.stop()
        core.close()
    return 0


def _redacted(url: str) -> str:
    """``url`` without a password (``postgresql://user:secret@host/db`` -> ``postgresql://user:***@host/db``)."""
    head, sep, rest = url.partition("://")
    credentials, at, location = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    return f"{head}{sep}{credentials.split(':', 1)[0]}:***@{location}"

