"""``AsyncReplayExecutor``: replays configurations of one recorded instance on replay servers.

The tuning loop stays simple and synchronous (``evaluate``) or fans out
(``submit`` -> future) while the work runs on one gRPC replay server per GPU
(``mneme serve``), local or remote:

* ``servers=None`` (the embedded default) starts one server per visible GPU on
  a free loopback port, reachable only with a per-executor random token, and
  stops them with the executor. ``num_workers`` worker processes are spread
  over the GPUs (more workers than GPUs puts several on a GPU).
* ``servers=["host:port", ...]`` spreads the work over running servers.
* ``compile_ahead=[configs]`` has every server compile the code of those
  configurations while it prepares the instance (one per code variant of a
  search space is enough), so that no replay of them waits for a compile.

The executor is two threads whatever the number of servers: the caller's, and one running an
asyncio event loop (``grpc.aio``) that holds every server's calls and all scheduling state.

Every result stays attached to its configuration (a request id per
submission); a server that goes away has its outstanding work retried on
another (or on itself once it is back), and a result is never counted twice.
A configuration that crashes or hangs a worker comes back as a result with
``failed=True`` and the reason, as in the reference; so does one that cannot be
delivered because no server is reachable. A request the server refuses
(unknown record, bad token) raises ``ReplayServerError`` from
``future.result()``: that is a setup problem, not a tuning outcome.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import json
import os
import secrets
import threading
import time
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _string
from pathlib import Path
from typing import Any, Mapping, Sequence

import grpc
import grpc.aio

from mneme._internal.startup_trace import mark
from mneme.errors import ConfigurationError, MnemeError
from mneme.model.experiment import (
    STATUS_INTERNAL_ERROR,
    ExperimentConfiguration,
    ExperimentResult,
)
from mneme.model.json_text import json_encoder
from mneme.model.verification import VerificationSettings
from replay_server.client.connection import HOLD_RESPONSES_SECONDS, TRANSPORTS, ConnectionSettings
from replay_server.client.local_servers import LocalServers, split_database

RESULTS_FILE = "results.jsonl"
#: Code variants one executor may ask its servers to compile ahead (a server's Prepare takes at most this many).
MAX_COMPILE_AHEAD = 4096
# Transport-level failures: the server (or the way to it) went away; the work is retried elsewhere.
_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
}


class ReplayServerError(MnemeError):
    """A replay server refused a request (unknown recording, bad token, malformed request)."""


def server_capacity(workers: int, transport: str = "stream") -> int:
    """Requests one server holds at once; the rest waits in the client.

    Per worker, the two it has been handed (the server's pipelining) and more
    waiting in the server's queue, so that a worker finds its next job there
    while results travel back and the client sends the next requests, and can
    take a job whose code is compiled ahead of one still compiling.

    ``unary``: two waiting per worker and four to spare, at most 48: a server
    answers RESOURCE_EXHAUSTED beyond 60 calls at once (``rpc_threads`` 64
    less 4). ``stream``: one call carries them all, and no thread limit holds,
    so the queue is deeper, six per worker and eight to spare: answers reach
    the client in bursts, and with two waiting per worker the workers sat idle
    ~15% of a sweep in the per-request traces. (On the reference's space the
    deeper queue measured within the run-to-run noise, with less client CPU
    per result: docs/serving.md.)
    """
    workers = max(1, workers)
    if transport == "unary":
        return min(workers * 4 + 4, 48)
    return min(workers * 8 + 8, 256)


#: Waiting configurations the dispatcher looks through for one a server can run without a compile wait.
LOOKAHEAD = 64
#: Configurations sent to a server for code it is still compiling (for the first of them), at most.
SENT_PER_COMPILE = 2
#: Requests a stream sends an idle server in one round, at most: they go out at once as a message of
#: their own, and the rest of its places are filled a moment later, so that its workers start and its
#: compiles begin while the dispatcher still prepares the rest (a full window takes milliseconds of
#: Python, and a stream's message leaves only when the dispatcher lets go of the interpreter).
FIRST_MESSAGE = 8
#: How long the dispatcher waits for events after a round that left requests for the next one: it lets
#: the streams' threads send what the round prepared.
FIRST_MESSAGE_PAUSE = 0.0005
_strict_json = json_encoder(allow_nan=False)  # a result's text, which the tuner may write again as it is


class ReplayFuture(Future):
    """The future of one configuration's ExperimentResult. When the executor writes ``results.jsonl``,
    it also carries the result as written there: ``result_dict`` (``result.to_dict()``) and
    ``result_json`` (its JSON text; None when it needed more than strict JSON, e.g. an infinity). A
    caller that records the result again (the tuner's ``trials.jsonl``) reuses them instead of
    converting and encoding it a second time."""

    result_dict: "dict[str, Any] | None" = None
    result_json: str | None = None


@dataclass(slots=True)  # one per configuration submitted: slots make it cheaper to create
class _Task:
    config: ExperimentConfiguration
    future: ReplayFuture
    request_id: str
    attempts: int = 0
    stranded_since: float | None = None  # since when no server could take it
    errors: list[str] | None = None  # why attempts failed (made with the first)
    finished: bool = False  # its result is taken (delivered at the end of the dispatcher's round)
    _code: tuple | None = None

    @property
    def code(self) -> tuple:
        """The configuration's ``code_identity``: tasks with equal ``code`` share a compile.
        (Computed by the dispatcher when it first needs it, not in ``submit``.)"""
        if self._code is None:
            self._code = self.config.code_identity()
        return self._code


@dataclass
class _Server:
    address: str
    channel: grpc.Channel
    stub: Any
    capacity: int = 4
    outstanding: int = 0
    down_until: float = 0.0
    failures: int = 0
    preparing: Any = None  # the Prepare call made on connecting
    compiled: set[tuple] = field(default_factory=set)  # codes this server answered a configuration of
    compiling: dict[tuple, int] = field(default_factory=dict)  # codes sent, not answered yet: how many tasks
    stream: "_Stream | None" = None  # the ReplayBatchStream call its requests go over (transport "stream")
    outbox: list = field(default_factory=list)  # requests of this dispatch round, not handed to the stream yet
    retired: bool = False  # gets no new work (its announcement expired: replay_server.discovery)

    def available(self, now: float) -> bool:
        return now >= self.down_until and self.outstanding < self.capacity and not self.retired


_RECORDED_CODE = ExperimentConfiguration().code_identity()  # the code of the recorded launch's knobs


class _Stream:
    """One ``ReplayBatchStream`` call to a server, on the executor's event loop. The dispatcher hands it
    the requests of a round together (``send``) and they go out as one message, with whatever else is
    waiting by the time the previous write is done; the responses come back as the server has them
    ready, as ``("responses", ...)`` events, and the call's end as one ``("stream_end", ...)`` event.
    ``pending`` maps the request ids sent and not answered to their tasks. Everything here runs in the
    loop's thread: a stream is two coroutines, not threads."""

    def __init__(self, executor: "AsyncReplayExecutor", server: _Server, metadata: tuple,
                 hold_responses: float) -> None:
        self.pending: dict[str, _Task] = {}
        self._hold = hold_responses
        self._outbox: list = []
        self._closing = False
        self._wakeup = asyncio.Event()
        self._call = server.stub.ReplayBatchStream(metadata=metadata)
        executor._spawn(self._write())
        executor._spawn(self._read(server, executor))

    def send(self, requests: list) -> None:
        self._outbox += requests
        self._wakeup.set()

    def close(self) -> None:
        """No more requests: the server answers those it has, then ends the call."""
        self._closing = True
        self._wakeup.set()

    async def _write(self) -> None:
        from replay_server.protocol import replay_pb2

        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                if self._outbox:  # what came while the last write was under way goes in this message
                    batch, self._outbox = self._outbox, []
                    await self._call.write(replay_pb2.ReplayBatch(requests=batch, hold_responses_seconds=self._hold))
                if self._closing and not self._outbox:
                    await self._call.done_writing()
                    return
        except (grpc.RpcError, asyncio.InvalidStateError, asyncio.CancelledError):
            return  # the call ended: its reader reports how

    async def _read(self, server: _Server, executor: "AsyncReplayExecutor") -> None:
        code, details = grpc.StatusCode.OK, ""
        try:
            while True:
                batch = await self._call.read()
                if batch is grpc.aio.EOF:
                    break
                executor._post(("responses", server, self, batch.responses))
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or exc.code().name
        except asyncio.CancelledError:
            code, details = grpc.StatusCode.CANCELLED, "the executor shut down"
        executor._post(("stream_end", server, self, code, details))


class AsyncReplayExecutor:
    """Evaluate configurations of ``record_id`` in ``record_db`` asynchronously, on replay servers.

    The reference's arguments come first, unchanged; how to reach the servers and how they verify
    are one settings object each.

    Args:
        record_db: the recording database (``<static-hash>.json``; a path, or its key in remote
            servers' store).
        record_id: the instance (dynamic hash) to replay.
        iterations: measured launches per replay.
        results_db_dir: where ``results.jsonl`` gets a line per result (None: no file).
        num_workers: worker processes of the local servers (spread over their GPUs).
        servers: ``host:port`` of running servers (fills ``connection.servers``); None: local servers.
        warmup: launches before the measured ones.
        record_key: the database's key in remote servers' stores (default: its file name).
        timeout_seconds: per-replay watchdog (0: the servers' own).
        compile_ahead: configurations whose code every server compiles while it prepares the
            instance (one per code variant is enough; at most ``MAX_COMPILE_AHEAD`` variants).
        verification: how the servers verify (``VerificationSettings``; default exact);
            ``set_verification`` changes it later.
        connection: how to reach the servers (``ConnectionSettings``: addresses, token, TLS,
            retries, transport, local servers' options; default local servers).
        local_servers: servers already started with ``LocalServers.start``, which the executor
            adopts and stops (instead of starting its own).

    Raises:
        ConfigurationError: a bad argument or setting (before any server is contacted).
        ReplayServerError: a server refused the executor (its token).
    """

    def __init__(
        self,
        record_db: str | os.PathLike[str],
        record_id: str,
        iterations: int = 3,
        results_db_dir: str | os.PathLike[str] | None = None,
        num_workers: int = 1,
        servers: Sequence[str] | None = None,
        warmup: int = 2,
        *,
        record_key: str | None = None,
        timeout_seconds: float = 0.0,
        compile_ahead: Sequence[ExperimentConfiguration | Mapping[str, Any]] = (),
        verification: VerificationSettings | None = None,
        connection: ConnectionSettings | None = None,
        local_servers: LocalServers | None = None,
    ) -> None:
        if iterations < 1:
            raise ConfigurationError(f"iterations={iterations}: at least one measured launch is needed")
        if warmup < 0:
            raise ConfigurationError(f"warmup={warmup} must not be negative")
        if num_workers < 1:
            raise ConfigurationError(f"num_workers={num_workers}: at least one worker is needed")
        connection = connection or ConnectionSettings()
        if not isinstance(connection, ConnectionSettings):
            raise ConfigurationError(f"connection={connection!r}: give a ConnectionSettings")
        if servers is not None:
            if connection.servers is not None and tuple(servers) != connection.servers:
                raise ConfigurationError("servers and connection.servers name different servers; give one of them")
            connection = connection.with_(servers=servers)
        self.connection = connection
        self.record_db = os.fspath(record_db)
        self.record_id = str(record_id)
        self.iterations = iterations
        self.warmup = warmup
        self.num_workers = num_workers
        self.timeout_seconds = timeout_seconds
        self.max_attempts = connection.max_attempts
        self.retry_window = connection.retry_window
        self.transport = connection.transport
        self.hold_responses = connection.hold_seconds
        self.set_verification(verification or VerificationSettings())
        self._ahead = _code_variants(compile_ahead)
        store, key = split_database(self.record_db)
        self.record_key = record_key or key
        self._results_path: Path | None = None
        if results_db_dir is not None:
            directory = Path(results_db_dir)
            directory.mkdir(parents=True, exist_ok=True)
            self._results_path = directory / RESULTS_FILE
        self._results_lock = threading.Lock()
        self._results_file: Any = None
        self._results_head = json.dumps({"record_db": self.record_db, "record_id": self.record_id})[:-1]
        self._finished_now: list[tuple[ReplayFuture, ExperimentResult, str]] = []  # this round's results
        self._local_servers: LocalServers | None = None
        self._finished = 0
        # The dispatcher's events: appended by any thread, taken by the loop's rounds (``_post``).
        self._events: "collections.deque[tuple]" = collections.deque()
        self._round_due = False  # a round is scheduled on the loop and has not started yet
        self._stopping = False
        self._spawned: set = set()  # the loop's tasks (held here: the loop keeps only weak references)
        self._backlog: "collections.deque[_Task]" = collections.deque()
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid()}-{secrets.token_hex(4)}"  # request ids: unique to this executor
        self._closed = False
        servers = connection.servers
        if servers is None and connection.tls:
            raise ConfigurationError("TLS settings apply to remote servers; local servers run on loopback")
        if servers is not None and local_servers is not None:
            raise ConfigurationError("give servers or local_servers, not both")
        self._token = connection.token or (_read_token(connection.token_file) if connection.token_file else None)
        self._credentials = _channel_credentials(connection.tls_ca, connection.tls_cert, connection.tls_key)
        self._server_name = connection.tls_server_name
        if servers is None:
            self._local_servers = local_servers or LocalServers.start_with(
                store, num_workers, connection, watchdog=self.timeout_seconds)
            self._token = self._local_servers.token
            servers = self._local_servers.addresses(connection.startup_timeout)
            mark("executor", "listening")
        # One thread runs an asyncio event loop that holds every server's calls (grpc.aio) and the
        # dispatcher's rounds: no thread per server or per call (docs/architecture.md, "The executor").
        self._loop = asyncio.new_event_loop()
        self._dispatcher = threading.Thread(target=self._run_loop, name="replay-dispatch", daemon=True)
        self._dispatcher.start()
        self._loop_thread = self._dispatcher.ident
        self._on_shutdown: list = []
        self._servers: list[_Server] = []
        try:
            self._on_loop(self._connect_all(list(servers)))
        except BaseException:
            self._end_loop()
            self._stop_local()
            raise
        mark("executor", "connected")
        self._loop.call_soon_threadsafe(self._tick)

    # -- public API ----------------------------------------------------------------------
    def submit(self, config: ExperimentConfiguration | Mapping[str, Any]) -> "Future[ExperimentResult]":
        """Queue one configuration; the future's ``result()`` is its ExperimentResult."""
        if self._closed:
            raise MnemeError("this AsyncReplayExecutor was shut down; create a new one")
        if not isinstance(config, ExperimentConfiguration):
            config = ExperimentConfiguration.from_dict(config)
        task = _Task(config, ReplayFuture(), f"{self._id_prefix}-{next(self._ids)}")
        task.future.set_running_or_notify_cancel()
        self._post(("submit", task))
        return task.future

    def evaluate(self, config: ExperimentConfiguration | Mapping[str, Any]) -> ExperimentResult:
        """Replay one configuration and wait for its result."""
        return self.submit(config).result()

    def wait_prepared(self, timeout: float | None = None) -> None:
        """Wait until every server has prepared the instance (the call made on connecting): its workers
        restored it, its compile processes read it and compiled the ``compile_ahead`` code. A benchmark's
        timed part starts after this. A failed preparation is not raised here: its reason comes back with
        the replays."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for server in self._servers:
            if server.preparing is None:
                continue
            try:
                server.preparing.result(timeout=None if deadline is None else max(deadline - time.monotonic(), 0))
            except FutureTimeoutError:
                raise TimeoutError(f"replay server {server.address} did not prepare the instance in {timeout:g}s")
            except (grpc.RpcError, CancelledError):  # failed or abandoned (a server that went away)
                pass

    def shutdown(self, wait: bool = True) -> None:
        """Finish (``wait``) or fail the outstanding work, close connections, stop local servers."""
        if self._closed:
            return
        self._closed = True
        for callback in self._on_shutdown:
            callback()
        if not wait:
            self._post(("abandon", None))
        self._post(("stop", None))
        self._dispatcher.join()  # the loop ends when the work has (its channels closed)
        with self._results_lock:
            if self._results_file is not None:
                self._results_file.close()
        self._stop_local()

    def _stop_local(self) -> None:
        if self._local_servers is not None:
            self._local_servers.stop()

    def __enter__(self) -> "AsyncReplayExecutor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def servers(self) -> list[str]:
        return [s.address for s in self._servers if not s.retired]

    # -- servers that join and leave (replay_server.discovery) -----------------------------------
    def add_server(self, address: str) -> None:
        """Use one more replay server from now on (it prepares the instance first, as the others did)."""
        if self._closed:
            raise MnemeError("this AsyncReplayExecutor was shut down; create a new one")
        self._post(("join", self._on_loop(self._connect(address))))

    def retire_server(self, address: str) -> None:
        """Send no new work to ``address``; what it holds is answered, or retried elsewhere if it is gone."""
        self._post(("retire", address))

    def on_shutdown(self, callback) -> None:
        """Call ``callback()`` when the executor shuts down (a discovery watcher stops with it)."""
        self._on_shutdown.append(callback)

    # -- the event loop (one thread: every call of every server, and the dispatcher's rounds) ------
    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
            # Stopped (the channels closed): what is left of the calls' tasks ends as asyncio.run ends them.
            left = asyncio.all_tasks(self._loop)
            for task in left:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        finally:
            self._loop.close()

    def _on_loop(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the loop and wait for its value (from any thread but the loop's)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _end_loop(self) -> None:
        """Stop the loop (its channels closed) and wait for its thread."""
        async def close() -> None:
            await self._close_channels()
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(close(), self._loop)
        self._dispatcher.join()

    async def _close_channels(self) -> None:
        servers = getattr(self, "_servers", [])
        await asyncio.gather(*(server.channel.close() for server in servers), return_exceptions=True)

    def _spawn(self, coroutine: Any) -> None:
        """Start ``coroutine`` as a task of the loop (called in the loop's thread)."""
        task = self._loop.create_task(coroutine)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)

    def _post(self, event: tuple) -> None:
        """Hand the dispatcher an event, from any thread: a round runs soon and takes every event there
        is by then, so events that come together (a server's message of responses, a tuner's burst of
        submissions) cost the loop one wake-up, not one each."""
        self._events.append(event)
        if not self._round_due:  # (cleared by the round before it takes the events: none is left behind)
            self._round_due = True
            if threading.get_ident() == self._loop_thread:
                self._loop.call_soon(self._round)
            else:
                self._loop.call_soon_threadsafe(self._round)

    def _tick(self) -> None:
        """A round at least every 0.1 s: retries wait for a server's back-off, stranded work for its window."""
        if not self._round_due:
            self._round_due = True
            self._round()
        self._loop.call_later(0.1, self._tick)

    # -- servers -------------------------------------------------------------------------
    async def _connect_all(self, addresses: list[str]) -> None:
        servers = await asyncio.gather(*(self._connect(address) for address in addresses), return_exceptions=True)
        failed = next((s for s in servers if isinstance(s, BaseException)), None)
        if failed is not None:
            await asyncio.gather(*(s.channel.close() for s in servers if isinstance(s, _Server)))
            raise failed
        self._servers = servers  # (in the loop's thread, before the first round that looks at them)

    async def _connect(self, address: str) -> _Server:
        from replay_server.protocol import replay_pb2, replay_pb2_grpc
        from replay_server.protocol.convert import config_to_proto

        options = [("grpc.max_receive_message_length", 4 << 20)]
        if self._server_name:
            options.append(("grpc.ssl_target_name_override", self._server_name))
        if self._credentials is not None:
            channel = grpc.aio.secure_channel(address, self._credentials, options=options)
        else:
            channel = grpc.aio.insecure_channel(address, options=options)
        server = _Server(address, channel, replay_pb2_grpc.ReplayServiceStub(channel))
        try:
            info = await server.stub.GetServerInfo(replay_pb2.ServerInfoRequest(), metadata=self._metadata(),
                                                   timeout=10)
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                await channel.close()
                raise ReplayServerError(f"replay server {address} refused us: {exc.details()}") from None
            server.down_until = time.monotonic() + 1.0  # not up yet: retried by the dispatcher
            return server
        server.capacity = server_capacity(int(info.workers), self.transport)
        # Restore the instance on every worker, have every compile process read it and compile the
        # compile_ahead code now, not in the first replays (errors surface with those); wait_prepared()
        # waits for it.
        server.preparing = Future()
        self._spawn(self._prepare(server, replay_pb2.PrepareRequest(
            instance=self._instance_ref(), compile=[config_to_proto(config) for _, config in self._ahead])))
        return server

    async def _prepare(self, server: _Server, request: Any) -> None:
        try:
            answer = await server.stub.Prepare(request, metadata=self._metadata())
        except grpc.RpcError as exc:
            server.preparing.set_exception(exc)
            answer = None
        except asyncio.CancelledError:
            server.preparing.cancel()
            return
        else:
            server.preparing.set_result(answer)
        # Preparing compiles the recorded launch's code there: its configurations need no compile wait.
        self._post(("prepared", server, answer))

    async def _replay(self, task: _Task, server: _Server, request: Any) -> None:
        """One ``Replay`` call (transport ``unary``); its end is a ``done`` event."""
        try:
            response = await server.stub.Replay(request, metadata=self._metadata())
        except grpc.RpcError as exc:
            self._post(("done", task, server, exc.code(), exc.details() or exc.code().name, None))
        except asyncio.CancelledError:
            self._post(("done", task, server, grpc.StatusCode.CANCELLED, "the executor shut down", None))
        else:
            self._post(("done", task, server, grpc.StatusCode.OK, "", response))

    def set_verification(self, verification: VerificationSettings) -> None:
        """How the servers verify the replays asked for from now on (``InstanceRef.verification``).

        A tuner sends the bounds it derived on its baseline this way (``derived``). New settings are a new
        prepared instance on the servers (restored on a worker's first replay of it).

        Args:
            verification: the settings (every policy is checked here, not on every server).
        """
        from mneme.replay.tolerance import judged_overrides

        if not isinstance(verification, VerificationSettings):
            raise ConfigurationError(f"verification={verification!r}: give a VerificationSettings")
        judged_overrides(verification)  # fails here, not on every server
        self.verification = verification
        self._instance = None  # made again with the new settings

    def _instance_ref(self) -> Any:
        """The ``InstanceRef`` every request carries (made once per verification setting)."""
        from replay_server.protocol import replay_pb2
        from replay_server.protocol.convert import verification_to_proto

        instance = self._instance
        if instance is None:
            instance = self._instance = replay_pb2.InstanceRef(
                record_db=self.record_key, record_id=self.record_id,
                verification=verification_to_proto(self.verification))
        return instance

    def _metadata(self) -> tuple:
        return (("authorization", f"Bearer {self._token}"),) if self._token else ()

    # -- dispatching (the loop's thread owns all scheduling state) ------------------------
    def _round(self) -> None:
        """Take the events that are there, then send what can go and deliver what came in."""
        self._round_due = False
        events = self._events
        for _ in range(len(events)):  # (the events of this moment; those posted meanwhile wait for the next round)
            self._stopping = self._handle(events.popleft()) or self._stopping
        if self._pump():  # an idle server got its first requests: the rest after its stream has sent them
            self._loop.call_later(FIRST_MESSAGE_PAUSE, self._post, ("pump",))
        self._flush()
        self._deliver()
        if self._stopping and not self._events and self._idle():
            self._stopping = False  # (once)
            for server in self._servers:
                if server.stream is not None:
                    server.stream.close()
            self._spawn(self._end())

    def _idle(self) -> bool:
        return not self._backlog and all(s.outstanding == 0 for s in self._servers)

    async def _end(self) -> None:
        """The work is done: close the channels, then stop the loop (``shutdown`` joins its thread)."""
        await self._close_channels()
        self._loop.stop()

    def _handle(self, event: tuple) -> bool:
        """One event; True for ``stop``."""
        kind = event[0]
        if kind == "submit":
            self._backlog.append(event[1])
        elif kind == "done":  # a unary call ended
            self._on_answer(*event[1:])
        elif kind == "responses":  # answers on a stream
            server, stream, responses = event[1:]
            for response in responses:
                self._on_stream_response(server, stream, response)
        elif kind == "stream_end":
            self._on_stream_end(*event[1:])
        elif kind == "prepared":
            server, answer = event[1], event[2]
            mark("executor", "prepared", server=server.address)
            if answer is not None:
                server.compiled.add(_RECORDED_CODE)
                errors = answer.compile_errors
                server.compiled.update(code for (code, _), error in zip(self._ahead, errors) if not error)
        elif kind == "abandon":
            for task in self._backlog:
                self._finish(task, ExperimentResult.failure(
                    STATUS_INTERNAL_ERROR, "the executor was shut down before this configuration ran"))
            self._backlog.clear()
        elif kind == "join":
            joined = event[1]
            earlier = next((s for s in self._servers if s.address == joined.address), None)
            if earlier is None:
                self._servers.append(joined)
            else:  # it came back: the new connection is not needed
                earlier.retired = False
                self._spawn(joined.channel.close())
        elif kind == "retire":
            for server in self._servers:
                server.retired = server.retired or server.address == event[1]
        elif kind == "stop":
            return True  # (kind "pump": a round, nothing to handle)
        return False

    def _pump(self) -> bool:
        """Send waiting work to servers with room; fail it only when no server is up for ``retry_window``.

        True when a server that was idle got its ``FIRST_MESSAGE`` and could take more: the next round
        comes right after the streams have sent this one's."""
        now = time.monotonic()
        if not any(now >= s.down_until and not s.retired for s in self._servers):
            for task in self._backlog:
                task.stranded_since = task.stranded_since or now
                if now - task.stranded_since > self.retry_window:
                    self._give_up(task, f"no replay server reachable for {self.retry_window:g}s")
            self._backlog = collections.deque(t for t in self._backlog if not t.finished)
            return False
        # An idle server's first requests go out before the rest of its places are filled (streams only:
        # a unary call leaves at once).
        idle = {id(s) for s in self._servers if s.outstanding == 0 and self.transport == "stream"}
        # Servers with room, least loaded first (index: the earlier one of equally loaded servers). A server
        # that has nothing it could start now, or has had its first message's worth, leaves the heap.
        room = [(s.outstanding / s.capacity, i, s) for i, s in enumerate(self._servers) if s.available(now)]
        heapq.heapify(room)
        more_now = False
        while self._backlog and room:
            _, index, server = heapq.heappop(room)
            if id(server) in idle and server.outstanding >= FIRST_MESSAGE:
                more_now = True
                continue
            task = self._take_for(server)
            if task is None:
                continue
            if not task.finished:
                self._send(task, server)
            if server.available(now):
                heapq.heappush(room, (server.outstanding / server.capacity, index, server))
        return more_now

    def _take_for(self, server: _Server) -> _Task | None:
        """The first waiting task ``server`` can start without waiting for a compile it is already doing.

        A server's place for a configuration is better used by one whose code it has (or whose compile it
        has not started: sending it starts that compile) than by a configuration that would wait behind a
        compile in progress there; at most ``SENT_PER_COMPILE`` of those are sent, and the rest follow as
        soon as the first answer shows the code compiled. So while a new variant compiles, the server runs
        the configurations of code it already has.
        """
        for index, task in enumerate(itertools.islice(self._backlog, LOOKAHEAD)):
            if task.code in server.compiled or server.compiling.get(task.code, 0) < SENT_PER_COMPILE:
                del self._backlog[index]
                return task
        return None

    def _send(self, task: _Task, server: _Server) -> None:
        from replay_server.protocol import replay_pb2
        from replay_server.protocol.convert import config_fields

        request = replay_pb2.ReplayRequest(
            request_id=task.request_id,
            instance=self._instance_ref(),
            config=config_fields(task.config),
            iterations=self.iterations,
            warmup=self.warmup,
            timeout_seconds=self.timeout_seconds,
        )
        task.attempts += 1
        task.stranded_since = None
        server.outstanding += 1
        if task.code not in server.compiled:
            server.compiling[task.code] = server.compiling.get(task.code, 0) + 1
        if self.transport == "unary":
            self._spawn(self._replay(task, server, request))
            return
        if server.stream is None:
            server.stream = _Stream(self, server, self._metadata(), self.hold_responses)
        server.stream.pending[task.request_id] = task
        server.outbox.append(request)

    def _flush(self) -> None:
        """The requests of this round go out, one message per server."""
        for server in self._servers:
            if server.outbox:
                server.stream.send(server.outbox)
                server.outbox = []

    def _on_stream_response(self, server: _Server, stream: _Stream, response: Any) -> None:
        task = stream.pending.pop(response.request_id, None)
        if task is None:  # not ours, or already answered: nothing to count
            return
        if response.error_code:  # the server could not serve it: as a unary call would have ended
            code = getattr(grpc.StatusCode, response.error_code, grpc.StatusCode.INTERNAL)
            self._on_answer(task, server, code, response.error_message or response.error_code, None)
        else:
            self._on_answer(task, server, grpc.StatusCode.OK, "", response)

    def _on_stream_end(self, server: _Server, stream: _Stream, code: grpc.StatusCode, details: str) -> None:
        """The call ended: what it had not answered fails as the call did (retried when the server went
        away), and the next request opens a new call."""
        if server.stream is stream:
            server.stream = None
        if code == grpc.StatusCode.OK:
            code, details = grpc.StatusCode.UNAVAILABLE, "the server ended the stream before answering"
        for task in list(stream.pending.values()):
            self._on_answer(task, server, code, details, None)
        stream.pending.clear()

    def _on_answer(self, task: _Task, server: _Server, code: grpc.StatusCode, details: str, response: Any) -> None:
        """A server's answer for ``task``: its ReplayResponse (``code`` OK), or the status it failed with."""
        from replay_server.protocol.convert import result_from_proto

        server.outstanding -= 1
        if task.code in server.compiling:
            server.compiling[task.code] -= 1
            if not server.compiling[task.code]:
                del server.compiling[task.code]
        if code == grpc.StatusCode.OK:
            server.failures = 0
            server.compiled.add(task.code)
            if response.request_id == task.request_id:
                self._finish(task, result_from_proto(response.result), server.address, response.worker)
                return
            code, details = grpc.StatusCode.INTERNAL, f"response for {response.request_id!r} on our call"
        if code not in _RETRYABLE:
            if not task.future.done():
                task.future.set_exception(ReplayServerError(f"replay server {server.address}: {code.name}: {details}"))
            return
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN):
            server.failures += 1
            server.down_until = time.monotonic() + min(0.5 * 2 ** (server.failures - 1), 10.0)
        task.errors = (task.errors or []) + [f"{server.address}: {code.name}: {details}"]
        if task.attempts >= self.max_attempts:
            self._give_up(task, f"{task.attempts} attempts failed")
        else:
            self._backlog.appendleft(task)

    def _give_up(self, task: _Task, why: str) -> None:
        detail = "; ".join((task.errors or [])[-3:]) or "no server answered"
        self._finish(task, ExperimentResult.failure(
            STATUS_INTERNAL_ERROR,
            f"replay server lost: {why} ({detail}); check that the servers are running (mneme serve)",
            warmup=self.warmup,
        ))

    def _finish(self, task: _Task, result: ExperimentResult, server: str = "", worker: str = "") -> None:
        """``task``'s result. Its ``results.jsonl`` line and its future's result wait for the end of the
        round (``_deliver``): a round's results reach the file in one write, before their futures."""
        if task.finished or task.future.done():  # a late duplicate: a result is counted once
            return
        task.finished = True
        line = ""
        if self._results_path is not None:
            future = task.future
            future.result_dict = record = result.to_dict()
            try:
                future.result_json = text = _strict_json(record)
            except ValueError:  # an infinity or NaN: written as json.dumps writes it, not shared as strict JSON
                text = json.dumps(record)
            # json.dumps of the record (its keys in this order), from the parts' texts
            line = (f'{self._results_head}, "config_hash": "{task.config.hash()}", "config": {task.config.to_json()}, '
                    f'"result": {text}, "server": {_string(server)}, "worker": {_string(worker)}, '
                    f'"attempts": {task.attempts}, "time": {time.time()!r}}}\n')
        self._finished_now.append((task.future, result, line))
        self._finished += 1
        if self._finished <= 2:  # the first results: the start-up trace's end points (a tuner's baseline, first trial)
            mark("executor", "result", index=self._finished, verified=result.verified)

    def _deliver(self) -> None:
        """The round's results: their lines in one write, then their futures (a waiter finds its line written)."""
        if not self._finished_now:
            return
        finished, self._finished_now = self._finished_now, []
        if self._results_path is not None:
            with self._results_lock:
                if self._results_file is None:
                    self._results_file = open(self._results_path, "a")
                self._results_file.write("".join(line for _, _, line in finished))
                self._results_file.flush()
        for future, result, _ in finished:
            future.set_result(result)


def _code_variants(configs: Sequence[ExperimentConfiguration | Mapping[str, Any]]) \
        -> list[tuple[tuple, ExperimentConfiguration]]:
    """One (code, configuration) per distinct ``code_knobs`` of ``configs``, in their order."""
    variants: dict[tuple, ExperimentConfiguration] = {}
    for config in configs:
        if not isinstance(config, ExperimentConfiguration):
            config = ExperimentConfiguration.from_dict(config)
        variants.setdefault(config.code_identity(), config)
    if len(variants) > MAX_COMPILE_AHEAD:
        raise ConfigurationError(f"compile_ahead names {len(variants)} code variants; at most {MAX_COMPILE_AHEAD} "
                                 "(compile the likeliest ones ahead, the others compile when first replayed)")
    return list(variants.items())


def _read_token(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigurationError(f"cannot read token file {path}: {exc.strerror}") from exc


def _channel_credentials(ca: str | None, cert: str | None, key: str | None) -> grpc.ChannelCredentials | None:
    if not (ca or cert or key):
        return None

    def read(path: str | None) -> bytes | None:
        if path is None:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise ConfigurationError(f"cannot read {path}: {exc.strerror}") from exc

    return grpc.ssl_channel_credentials(read(ca), read(key), read(cert))
