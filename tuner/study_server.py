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

import logging
import signal
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from mneme.errors import ConfigurationError
from mneme.network import is_loopback

log = logging.getLogger("mneme.study_server")

DEFAULT_PORT = 13000
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

    from mneme.tuning.shared_study import open_storage

    scheme = url.split(":", 1)[0].split("+", 1)[0] if isinstance(url, str) else ""
    if scheme not in ("journal", "sqlite", "postgresql", "postgres", "mysql"):
        raise ConfigurationError(f"mneme study-server {url!r}: give {STORAGE_FORMS}")
    storage = open_storage(url)
    if scheme == "journal":
        return storage
    if scheme == "sqlite":
        _sqlite_wal(storage.engine)
    return optuna.storages.get_storage(storage)  # RDBStorage -> _CachedStorage(RDBStorage)


def _batch_handler(storage: Any) -> Any:
    """mneme's addition to Optuna's service: a trial's user attributes in one call
    (``mneme.tuning.shared_study.BATCH_METHOD``; JSON ``{"trial_id": N, "attrs": {...}}``)."""
    import json

    import grpc

    from mneme.tuning.shared_study import BATCH_METHOD

    service, method = BATCH_METHOD.strip("/").split("/")
    set_all = getattr(storage, "set_trial_user_attrs", None)

    def apply(request: dict, context: Any) -> dict:
        try:
            trial_id, attrs = int(request["trial_id"]), dict(request["attrs"])
        except (KeyError, TypeError, ValueError):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, 'give {"trial_id": N, "attrs": {...}}')
        try:
            if set_all is not None:
                set_all(trial_id, attrs)
            else:
                for name, value in attrs.items():
                    storage.set_trial_user_attr(trial_id, name, value)
        except KeyError as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except RuntimeError as exc:  # the trial is finished
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return {}

    handler = grpc.unary_unary_rpc_method_handler(apply, request_deserializer=json.loads,
                                                  response_serializer=lambda o: json.dumps(o).encode())
    return grpc.method_handlers_generic_handler(service, {method: handler})


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


def make_server(storage: Any, host: str, port: int, threads: int = 16) -> tuple[Any, int]:
    """A gRPC server of Optuna's storage service over ``storage``, bound (not started).

    Args:
        storage: what :func:`open_proxied_storage` returns.
        host: listen address.
        port: listen port (0: a free one).
        threads: request threads.

    Returns:
        (the ``grpc.Server``, the bound port).
    """
    import grpc

    try:
        from optuna.storages._grpc.auto_generated import api_pb2_grpc
        from optuna.storages._grpc.servicer import OptunaStorageProxyService
    except ImportError as exc:  # optuna < 4.2
        raise ConfigurationError(f"Optuna's storage proxy is missing ({exc}); pip install 'optuna>=4.2'") from None
    if _is_journal(storage):  # a running trial belongs to the thread that created it (Optuna issue 6084)
        threads = 1
    server = grpc.server(ThreadPoolExecutor(max_workers=threads, thread_name_prefix="study"))
    api_pb2_grpc.add_StorageServiceServicer_to_server(OptunaStorageProxyService(storage), server)
    server.add_generic_rpc_handlers([_batch_handler(storage)])
    address = f"[{host.strip('[]')}]:{port}" if ":" in host.strip("[]") else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if not bound:
        raise ConfigurationError(f"mneme study-server: cannot listen on {address}: the port is taken or the "
                                 "address is not this machine's; give another --port or --host")
    return server, bound


def serve(url: str, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, insecure: bool = False,
          threads: int = 16, announce: Callable[[str], None] = print, stop: threading.Event | None = None) -> int:
    """Serve ``url``'s storage until SIGTERM/SIGINT (or ``stop`` is set).

    Args:
        url: the RDB URL (see :func:`open_proxied_storage`).
        host: listen address; beyond loopback only with ``insecure`` (the proxy has no authentication).
        port: listen port (0: a free one, printed).
        insecure: allow listening beyond loopback.
        threads: request threads.
        announce: receives the one line saying where tuners connect.
        stop: an event that stops the server when set (tests; signals do the same).

    Returns:
        0 after a clean stop.
    """
    if not insecure and not is_loopback(host):
        raise ConfigurationError(
            f"--host {host}: Optuna's storage proxy has no authentication, so anyone who reaches the port could "
            "read and write the study; listen on 127.0.0.1, or pass --insecure where only the tuners reach it")
    warnings.filterwarnings("ignore", category=Warning, module="optuna")  # ExperimentalWarning of the proxy
    storage = open_proxied_storage(url)
    server, bound = make_server(storage, host, port, threads)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    server.start()
    shown = f"[{host.strip('[]')}]" if ":" in host.strip("[]") else host
    announce(f"mneme study-server: serving {_redacted(url)} on {shown}:{bound} "
             f"(tuners: --optuna-storage grpc://{shown}:{bound})")
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop(grace=2.0).wait()
    return 0


def _redacted(url: str) -> str:
    """``url`` without a password (``postgresql://user:secret@host/db`` -> ``postgresql://user:***@host/db``)."""
    head, sep, rest = url.partition("://")
    credentials, at, location = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    return f"{head}{sep}{credentials.split(':', 1)[0]}:***@{location}"

