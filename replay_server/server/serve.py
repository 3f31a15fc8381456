"""Assembles one replay server: store, worker pool, compile pool, gRPC, metrics, health."""

from __future__ import annotations

import logging
import os
import signal
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from mneme._internal.network import is_loopback
from mneme._internal.startup_trace import mark
from mneme.errors import ConfigurationError
from mneme.store.keys import is_local_store, local_store_root
from replay_server.kept_servers import SERVERS_ON_HOST_ENV
from replay_server.protocol import health_pb2_grpc, replay_pb2_grpc
from replay_server.server.auth import BearerTokenInterceptor, read_token_file
from replay_server.server.clocks import LOCK_MODES, ServerClocks
from replay_server.server.compile_cache import CompileCache
from replay_server.server.engines import load_engine_spec
from replay_server.server.health import HealthService
from replay_server.server.idle import Activity, ActivityInterceptor, exit_when_idle
from replay_server.server.metrics import ServerMetrics
from replay_server.server.parent import when_parent_gone
from replay_server.server.service import ReplayService
from replay_server.server.worker_pool import PoolSettings, WorkerPool

log = logging.getLogger("mneme.serve")

# Requests and results are small; a cap keeps a hostile client from making the server buffer gigabytes.
DEFAULT_MAX_MESSAGE_BYTES = 4 << 20


@dataclass
class ServerOptions:
    gpu: int = 0
    port: int = 50051
    host: str = "[::]"
    metrics_port: int | None = None
    metrics_host: str | None = None  # where /metrics listens; None: where the gRPC listener does (host)
    store: str = "."
    workers: int = 1
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    token_file: str | None = None
    watchdog: float = 30.0
    engine: object = None  # None/"cuda": the CUDA engine; "module:factory" or an EngineSpec (tests)
    compile_processes: int = 0  # 0: default_compile_processes(); -1: no compile pool
    depth: int = 2
    batch: int = 8  # configurations of one instance a worker message (one engine call) carries at most
    max_start_failures: int = 3
    startup_timeout: float = 120.0
    prepared_cache_bytes: int = 0  # per worker; 0: half the device memory, shared by the workers
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    rpc_threads: int = 64
    announce: str | None = None  # a directory or s3://bucket/prefix to announce this server in (replay_server.discovery)
    announce_address: str | None = None  # HOST:PORT clients should use (default: this host's name and the port)
    lease: float = 30.0  # seconds an announcement stays live without a refresh
    keep_alive: float = 0.0  # exit after this many seconds without a call (0: run until stopped)
    local: bool = False  # a kept local server (replay_server.kept_servers): its announcement says what a tuner matches
    insecure: bool = False  # listen beyond loopback without a token or TLS (refused otherwise)
    reflection: bool = True  # gRPC server reflection (grpcurl, grpc_cli, Postman list and call the service)
    lock_clocks: str = "off"  # base | max: the GPU's clocks locked while serving (replay_server.server.clocks)

    def validate(self) -> None:
        if self.gpu < 0:
            raise ConfigurationError(f"--gpu {self.gpu}: give a GPU index (0, 1, ...)")
        if self.workers < 1:
            raise ConfigurationError(f"--workers {self.workers}: at least one worker process is needed")
        if not 1 <= self.batch <= MAX_BATCH:
            raise ConfigurationError(
                f"--batch {self.batch}: give 1 to {MAX_BATCH} (1: one configuration per engine call; a larger group "
                "can fill the GPU stream's queue while its start waits for the rest to be enqueued)")
        if self.watchdog <= 0:
            raise ConfigurationError(f"--watchdog {self.watchdog}: give a positive number of seconds")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigurationError("--tls-cert and --tls-key go together; give both or neither")
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigurationError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
        if self.lease <= 0:
            raise ConfigurationError(f"--lease {self.lease}: give a positive number of seconds")
        if self.lock_clocks not in LOCK_MODES:
            raise ConfigurationError(f"--lock-clocks {self.lock_clocks!r}: use one of {', '.join(LOCK_MODES)}")
        from replay_server.kept_servers import MIN_KEEP_ALIVE_S

        if self.keep_alive and self.keep_alive < MIN_KEEP_ALIVE_S:
            raise ConfigurationError(f"--keep-alive {self.keep_alive:g}: give at least {MIN_KEEP_ALIVE_S:g} seconds "
                                     "(or 0: run until stopped)")
        if is_local_store(self.store) and not local_store_root(self.store).is_dir():
            raise ConfigurationError(f"--store {self.store} is not a directory; give a directory or s3://bucket/prefix")


#: The longest ``ReplayServer.wait`` waits for a begun stop to end (gRPC's grace, then each worker's slot).
STOP_TIMEOUT_S = 60.0

#: The most configurations one engine call takes: a group's work is enqueued behind a gate that opens once
#: all of it is (so events time kernels, not enqueueing). On an H200 an engine call of 96 configurations of
#: 7 launches took a second to enqueue, the gate's time-out: the stream's queue, full behind the closed gate.
MAX_BATCH = 32


def default_compile_processes(workers: int, cpus: int | None = None, servers: int | None = None) -> int:
    """The compile pool's default size: this server's share of the host's CPUs (``$MNEME_SERVERS_ON_HOST``
    servers share them), less one for each of its workers and one for itself, and never fewer than
    ``min(4, CPUs)`` (the size before: a small host's compiles still run beside each other).

    Args:
        workers: the server's worker processes.
        cpus: the CPUs this process may use (default: its affinity).
        servers: the servers sharing them (default: ``$MNEME_SERVERS_ON_HOST``, else 1).

    Returns:
        The number of compile processes.
    """
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
    if servers is None:
        try:
            servers = max(1, int(os.environ.get(SERVERS_ON_HOST_ENV, "1")))
        except ValueError:
            servers = 1
    return max(min(4, cpus), cpus // servers - workers - 1, 1)


def listen_address(host: str) -> str:
    """``host`` as a socket bind address: ``[::]`` -> ``::``."""
    return host.strip("[]")


def exposure_error(options: "ServerOptions") -> str | None:
    """Why the server must not start as configured: listening beyond loopback with neither a bearer token
    nor TLS, unless ``insecure``; None when it may."""
    if options.insecure or options.token_file or options.tls_cert or is_loopback(options.host):
        return None
    where = "all interfaces" if listen_address(options.host) in ("::", "0.0.0.0") else options.host
    return (f"--host {options.host} listens on {where} without --token-file or --tls-cert: anyone who reaches the "
            "port could run kernels on this GPU; give --token-file FILE (and --tls-cert/--tls-key), or --host "
            "127.0.0.1, or --insecure to serve without them")


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"cannot read {what} {path}: {exc.strerror}") from exc


class ReplayServer:
    """One GPU's server. ``start()`` returns the bound port; ``stop()`` ends workers and pools."""

    def __init__(self, options: ServerOptions) -> None:
        options.validate()
        self.options = options
        self.spec = load_engine_spec(options.engine)
        self.metrics = ServerMetrics(options.gpu, self.spec.name)
        self.health = HealthService()
        settings = PoolSettings(
            gpu=options.gpu, workers=options.workers, depth=options.depth, batch=options.batch,
            startup_timeout=options.startup_timeout, max_start_failures=options.max_start_failures,
            prepared_cache_bytes=options.prepared_cache_bytes,
        )
        self.pool = WorkerPool(self.spec, settings, self.metrics, on_health=self.health.set_serving)
        self.compile_cache: CompileCache | None = None
        compiler = self.spec.compiler() if options.compile_processes >= 0 else None
        if compiler is not None:
            processes = options.compile_processes or default_compile_processes(options.workers)
            self.compile_cache = CompileCache(compiler, processes, self.metrics)
            self.pool.compile_cache = self.compile_cache
        self.service = ReplayService(
            self.pool, options.store, self.metrics, options.watchdog, self.spec.name, self.compile_cache
        )
        self.activity = Activity()  # replay-service calls, for --keep-alive
        self.clocks = ServerClocks(options.gpu, options.lock_clocks)
        self.clocks_line = ""  # what --lock-clocks did (the listening line says it)
        self.port = 0
        self._grpc: grpc.Server | None = None
        self._stopped = threading.Event()  # stop() began
        self._stop_done = threading.Event()  # stop() ended: gRPC, the workers, the clocks, the metrics

    def _credentials(self) -> grpc.ServerCredentials | None:
        o = self.options
        if not o.tls_cert:
            return None
        pair = [(_read(o.tls_key, "--tls-key"), _read(o.tls_cert, "--tls-cert"))]
        if o.tls_client_ca:
            return grpc.ssl_server_credentials(
                pair, root_certificates=_read(o.tls_client_ca, "--tls-client-ca"), require_client_auth=True
            )
        return grpc.ssl_server_credentials(pair)

    def start(self) -> int:
        o = self.options
        refused = exposure_error(o)
        if refused:
            raise ConfigurationError(refused)
        interceptors = [BearerTokenInterceptor(read_token_file(o.token_file))] if o.token_file else []
        if o.keep_alive:  # (after the token check: a refused call is no use)
            interceptors.append(ActivityInterceptor(self.activity))
        credentials = self._credentials()
        self.clocks_line = self.clocks.lock()  # before any replay: every measurement at the locked clocks
        self.pool.start()  # now: the workers' start-up (CUDA context, self-test) overlaps the rest
        mark("server", "workers_spawned")
        try:
            server = grpc.server(
                futures.ThreadPoolExecutor(max_workers=o.rpc_threads, thread_name_prefix="rpc"),
                interceptors=interceptors,
                options=[
                    ("grpc.max_receive_message_length", o.max_message_bytes),
                    ("grpc.max_send_message_length", o.max_message_bytes),
                    ("grpc.so_reuseport", 0),
                ],
                # Beyond this, callers get RESOURCE_EXHAUSTED instead of waiting on a starved thread pool.
                maximum_concurrent_rpcs=max(o.rpc_threads - 4, 1),
            )
            replay_pb2_grpc.add_ReplayServiceServicer_to_server(self.service, server)
            health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
            if o.reflection:
                try:
                    _enable_reflection(server)
                except (ImportError, RuntimeError) as exc:  # e.g. a grpcio-reflection newer than grpcio
                    log.warning("gRPC server reflection is off: grpcio-reflection cannot be used here (%s); "
                                "install the grpcio-reflection release that matches grpcio %s", exc, grpc.__version__)
            port = 0
            for host in [o.host] + (["0.0.0.0"] if o.host == "[::]" else []):  # hosts without IPv6: IPv4 only
                address = f"{host}:{o.port}"
                try:
                    port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
                except RuntimeError:  # grpcio raises instead of returning 0 for some failures
                    port = 0
                if port:
                    break
            if port == 0:
                raise ConfigurationError(f"cannot listen on {address}: the port is taken or the address is wrong")
            if o.metrics_port is not None:
                self._serve_metrics()
            server.start()
            self._grpc, self.port = server, port
            return port
        except BaseException:  # no server: no workers either
            self.pool.stop()
            self.clocks.restore()
            raise

    def _serve_metrics(self) -> None:
        """/metrics where ``--metrics-host`` says, else where the gRPC listener is (all interfaces: IPv6 and
        IPv4, or IPv4 alone on a host without IPv6)."""
        o = self.options
        host = listen_address(o.metrics_host or o.host)
        candidates = [host] + (["0.0.0.0"] if host == "::" else [])
        for address in candidates:
            try:
                self.metrics.serve_http(o.metrics_port, addr=address)
                return
            except OSError as exc:
                error = exc
        raise ConfigurationError(f"--metrics-port {o.metrics_port} on {host}: {error.strerror}; give a free port "
                                 "(or --metrics-host an address of this machine)")

    def stop(self, grace: float = 2.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        try:
            if self._grpc is not None:
                self._grpc.stop(grace)
            self.pool.stop()
            self.clocks.restore()  # after the workers: no replay runs at the restored clocks
            self.metrics.stop_http()
            if self.compile_cache is not None:
                self.compile_cache.close()
        finally:
            self._stop_done.set()

    def wait(self, stop_timeout: float = STOP_TIMEOUT_S) -> None:
        """Until the server is stopped: stop() called (by a signal, the keep-alive, the parent's exit) and
        ended, or ``stop_timeout`` seconds after it began (the process may then exit: an interpreter that
        exits while gRPC still shuts down can hang in its teardown).

        Args:
            stop_timeout: the longest wait for stop() to end once it began.
        """
        # In slices: a signal that the kernel hands to another thread (gRPC has several) does not interrupt a
        # wait without a time-out, and Python runs the handler only once the main thread looks again.
        while not self._stopped.wait(0.5):
            pass
        if not self._stop_done.wait(stop_timeout):
            log.warning("the server's stop did not end within %.0f s; exiting anyway", stop_timeout)

    def __enter__(self) -> "ReplayServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _enable_reflection(server: grpc.Server) -> None:
    """gRPC server reflection (grpcio-reflection) for the replay, health and reflection services."""
    from grpc_reflection.v1alpha import reflection

    from replay_server.protocol import health_pb2, replay_pb2

    names = (replay_pb2.DESCRIPTOR.services_by_name["ReplayService"].full_name,
             health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)


def serve_forever(options: ServerOptions, announce=print, parent_pid: int | None = None) -> int:
    """Run until SIGTERM/SIGINT (or, with ``parent_pid``, until that process is no longer the parent);
    announces the bound address (clients with --port 0 read it)."""
    server = ReplayServer(options)
    port = server.start()

    def stop(signum, frame):
        threading.Thread(target=server.stop, daemon=True).start()

    # Before the announcement: a client may stop the server as soon as it has read it.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if parent_pid is not None:  # the process that started this server exited, however: stop too

        def orphaned() -> None:
            log.warning("the process that started this server (pid %d) is gone: stopping", parent_pid)
            server.stop()

        when_parent_gone(parent_pid, orphaned)
    host = "127.0.0.1" if options.host in ("127.0.0.1", "localhost") else options.host
    if _unprotected(options):
        log.warning("listening on %s without a token or TLS (--insecure): anyone who reaches port %d can use "
                    "this GPU", host, port)
    mark("server", "listening")
    announce(
        f"mneme serve: listening on {host}:{port} (gpu {options.gpu}, {options.workers} worker(s), "
        f"engine {server.spec.name}, store {options.store}"
        + (f", metrics on {_metrics_url(options, server)}" if options.metrics_port is not None else "")
        + (", no token or TLS: --insecure" if _unprotected(options) else "")
        + (f", exits after {options.keep_alive:g} s without a call" if options.keep_alive else "")
        + (f", {server.clocks_line}" if server.clocks_line else "")
        + ")"
    )
    announcers = [start_announcer(server, port)] if options.announce else []

    def stop_when_idle() -> bool:
        # The announcement goes first, so that no tuner finds a server about to stop; one that found it
        # just before has called it (GetServerInfo): then the server stays, announced again. A call after
        # the decision is refused (UNAVAILABLE), so no tuner is answered by a server that then stops.
        while announcers:
            announcers.pop().stop()
        if not server.activity.close_if_idle(options.keep_alive):  # from here on, calls are refused
            if options.announce:
                announcers.append(start_announcer(server, port))
            return False
        server.stop()
        return True

    if options.keep_alive:
        exit_when_idle(server.activity, options.keep_alive, stop_when_idle)
    try:
        server.wait()
    finally:
        while announcers:
            announcers.pop().stop()
    return 0


def _unprotected(options: ServerOptions) -> bool:
    """Listening beyond loopback with neither token nor TLS (allowed by --insecure)."""
    return not (options.token_file or options.tls_cert or is_loopback(options.host))


def _metrics_url(options: ServerOptions, server: ReplayServer) -> str:
    host = listen_address(options.metrics_host or options.host)
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{getattr(server.metrics, 'http_port', options.metrics_port)}/metrics"


def start_announcer(server: ReplayServer, port: int):
    """Announce ``server`` in ``--announce``'s location and keep the announcement fresh (replay_server.discovery)."""
    import socket

    from mneme import __version__
    from replay_server.discovery import Announcement, Announcer
    from replay_server.server.health import _Status

    o = server.options
    host = o.host if o.host not in ("[::]", "0.0.0.0", "::") else socket.getfqdn()
    address = o.announce_address or f"{host}:{port}"

    local = {}
    if o.local:  # what a tuner of the same user matches before it reuses this server (replay_server.kept_servers)
        from replay_server.kept_servers import identity

        local = identity(o.store, o.engine if isinstance(o.engine, str) else None, Path(o.token_file), o.keep_alive)

    def describe() -> Announcement:
        return Announcement(address=address, gpu=o.gpu, gpu_name=str(server.pool.device.get("name", "")),
                            version=__version__, health=_Status.Name(server.health.status("") or 0),
                            workers=o.workers, engine=server.spec.name, lease_s=o.lease, **local)

    announcer = Announcer(o.announce, describe)
    first = announcer.start()
    log.info("announced %s in %s (lease %gs)", first.address, o.announce, o.lease)
    return announcer
