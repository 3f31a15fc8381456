"""``AsyncReplayExecutor``: replays configurations of one recorded instance on replay servers.

The tuning loop stays simple and synchronous (``evaluate``) or fans out
(``submit`` -> future) while the work runs on one gRPC replay server per GPU
(``mneme serve``), local or remote:

* no servers (the embedded default) starts one server per visible GPU on
  a free loopback port, reachable only with a per-executor random token, and
  stops them with the executor. ``num_workers`` worker processes are spread
  over the GPUs (more workers than GPUs puts several on a GPU).
* ``servers=["host:port", ...]`` spreads the work over running servers.
* ``compile_ahead=[configs]`` has every server compile the code of those
  configurations while it prepares the instance (one per code variant of a
  search space is enough), so that no replay of them waits for a compile.

The executor is a facade over its parts: the connection settings
(:mod:`~replay_server.client.connection`), the event loop in its second thread
(:mod:`~replay_server.client.event_loop`), the pure scheduling rules
(:mod:`~replay_server.client.scheduling`), the gRPC calls
(:mod:`~replay_server.client.channels`) and ``results.jsonl``
(:mod:`~replay_server.client.results_log`). It builds the requests and
handles the events of each round.

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
import itertools
import os
import secrets
import time
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any, Mapping, Sequence

import grpc

from mneme._internal.startup_trace import mark
from mneme.errors import ConfigurationError, MnemeError
from mneme.model.experiment import (
    STATUS_INTERNAL_ERROR,
    ExperimentConfiguration,
    ExperimentResult,
)
from mneme.model.measurement import MeasurementSettings
from mneme.model.verification import VerificationSettings
from mneme.replay.metrics import parse_metric_names
from replay_server.client.channels import (
    RETRYABLE,
    WENT_AWAY,
    Channels,
    ReplayServerError,
    Server,
    read_token,
)
from replay_server.client.channels import ReplayBatchStream as _Stream
from replay_server.client.connection import (
    HOLD_RESPONSES_SECONDS,
    TRANSPORTS,
    ConnectionSettings,
)
from replay_server.client.event_loop import EventLoop
from replay_server.client.local_servers import LocalServers, split_database
from replay_server.client.results_log import RESULTS_FILE, ReplayFuture, ResultsLog
from replay_server.client.scheduling import (
    FIRST_MESSAGE,
    LOOKAHEAD,
    SENT_PER_COMPILE,
    Scheduler,
    Task,
    give_up_reason,
    server_capacity,
)

__all__ = [
    "FIRST_MESSAGE",
    "HOLD_RESPONSES_SECONDS",
    "LOOKAHEAD",
    "MAX_COMPILE_AHEAD",
    "RESULTS_FILE",
    "SENT_PER_COMPILE",
    "TRANSPORTS",
    "AsyncReplayExecutor",
    "ConnectionSettings",
    "ReplayFuture",
    "ReplayServerError",
    "server_capacity",
]

#: Code variants one executor may ask its servers to compile ahead (a server's Prepare takes at most this many).
MAX_COMPILE_AHEAD = 4096
#: How long the dispatcher waits for events after a round that left requests for the next one: it lets
#: the streams' coroutines send what the round prepared.
FIRST_MESSAGE_PAUSE = 0.0005
_OK = grpc.StatusCode.OK


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
        measurement: what the servers measure besides times (``MeasurementSettings``: the energy
            window; default none, the GPU's conditions only).
        connection: how to reach the servers (``ConnectionSettings``: addresses, token, TLS,
            retries, transport, local servers' options; default local servers).
        local_servers: servers already started with ``LocalServers.start``, which the executor
            adopts and stops (instead of starting its own).
        metrics: hardware counters every replay collects after its timed launches (curated or raw
            CUPTI names, ``mneme.replay.metrics``): each result's ``metrics``, or its ``metrics_error``.

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
        measurement: MeasurementSettings | None = None,
        metrics: Sequence[str] = (),
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
        if connection.servers is None and connection.tls:
            raise ConfigurationError("TLS settings apply to remote servers; local servers run on loopback")
        if connection.servers is not None and local_servers is not None:
            raise ConfigurationError("give servers or local_servers, not both")
        self.connection = connection
        self.record_db = os.fspath(record_db)
        self.record_id = str(record_id)
        self.iterations = iterations
        self.warmup = warmup
        self.num_workers = num_workers
        self.timeout_seconds = timeout_seconds
        if measurement is not None and not isinstance(measurement, MeasurementSettings):
            raise ConfigurationError(f"measurement={measurement!r}: give a MeasurementSettings")
        self.measurement = measurement or MeasurementSettings()
        self.metrics = parse_metric_names(metrics)
        self.set_verification(verification or VerificationSettings())
        self._ahead = _code_variants(compile_ahead)
        store, key = split_database(self.record_db)
        self.record_key = record_key or key
        self._log = ResultsLog(results_db_dir, self.record_db, self.record_id) if results_db_dir is not None else None
        self._finished_now: list[tuple[ReplayFuture, ExperimentResult, str]] = []  # this round's results
        self._finished = 0
        self._local_servers: LocalServers | None = None
        self._stopping = False
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid()}-{secrets.token_hex(4)}"  # request ids: unique to this executor
        self._closed = False
        self._on_shutdown: list = []
        self._unary = connection.transport == "unary"
        self._scheduler = Scheduler(connection.max_attempts, connection.retry_window,
                                    None if self._unary else FIRST_MESSAGE)
        token = connection.token or (read_token(connection.token_file) if connection.token_file else None)
        addresses = connection.servers
        if addresses is None:
            self._local_servers = local_servers or LocalServers.start_with(
                store, num_workers, connection, watchdog=self.timeout_seconds)
            token = self._local_servers.token
            addresses = self._local_servers.addresses(connection.startup_timeout)
            mark("executor", "listening")
        # One thread runs an asyncio event loop that holds every server's calls (grpc.aio) and the
        # dispatcher's rounds: no thread per server or per call (docs/architecture.md, "The executor").
        self._dispatch = EventLoop(self._round)
        self._post = self._dispatch.post
        self._spawn = self._dispatch.spawn
        try:
            self._channels = Channels(connection, token, self._spawn, self._post)
            self._dispatch.call(self._connect_all(list(addresses)))
        except BaseException:
            self._dispatch.end(Channels.close(self._scheduler.servers))
            self._stop_local()
            raise
        mark("executor", "connected")
        self._dispatch.call_soon(self._dispatch.tick)

    # -- public API ----------------------------------------------------------------------
    def submit(self, config: ExperimentConfiguration | Mapping[str, Any]) -> "Future[ExperimentResult]":
        """Queue one configuration.

        Args:
            config: the configuration (or its dict, the reference's ``Replay-config``).

        Returns:
            Its future (a ``ReplayFuture``), whose ``result()`` is its ExperimentResult.
        """
        if self._closed:
            raise MnemeError("this AsyncReplayExecutor was shut down; create a new one")
        if not isinstance(config, ExperimentConfiguration):
            config = ExperimentConfiguration.from_dict(config)
        task = Task(config, ReplayFuture(), f"{self._id_prefix}-{next(self._ids)}")
        task.future.set_running_or_notify_cancel()
        self._post(("submit", task))
        return task.future

    def evaluate(self, config: ExperimentConfiguration | Mapping[str, Any]) -> ExperimentResult:
        """Replay one configuration and wait for its result.

        Args:
            config: the configuration (or its dict).

        Returns:
            Its ExperimentResult.
        """
        return self.submit(config).result()

    def wait_prepared(self, timeout: float | None = None) -> None:
        """Wait until every server has prepared the instance (the call made on connecting): its workers
        restored it, its compile processes read it and compiled the ``compile_ahead`` code. A benchmark's
        timed part starts after this. A failed preparation is not raised here: its reason comes back with
        the replays.

        Args:
            timeout: seconds at most (None: as long as it takes).

        Raises:
            TimeoutError: a server did not prepare in time.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        for server in self._scheduler.servers:
            if server.preparing is None:
                continue
            try:
                server.preparing.result(timeout=None if deadline is None else max(deadline - time.monotonic(), 0))
            except FutureTimeoutError:
                raise TimeoutError(f"replay server {server.address} did not prepare the instance in {timeout:g}s")
            except (grpc.RpcError, CancelledError):  # failed or abandoned (a server that went away)
                pass

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

    def shutdown(self, wait: bool = True) -> None:
        """Finish (``wait``) or fail the outstanding work, close connections, stop local servers.

        Args:
            wait: finish the work submitted (False: fail what no server has yet).
        """
        if self._closed:
            return
        self._closed = True
        for callback in self._on_shutdown:
            callback()
        if not wait:
            self._post(("abandon", None))
        self._post(("stop", None))
        self._dispatch.join()  # the loop ends when the work has (its channels closed)
        if self._log is not None:
            self._log.close()
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
        """The servers that take work (``host:port``)."""
        return [s.address for s in self._scheduler.servers if not s.retired]

    @property
    def capacity(self) -> int:
        """How many configurations the servers hold at once (``server_capacity`` of each; the rest wait
        in the client): what a caller keeps submitted to keep every worker busy."""
        held = sum(s.capacity for s in self._scheduler.servers if not s.retired)
        return held or server_capacity(self.num_workers)

    # -- servers that join and leave (replay_server.discovery) -----------------------------------
    def add_server(self, address: str) -> None:
        """Use one more replay server from now on (it prepares the instance first, as the others did).

        Args:
            address: its ``host:port``.
        """
        if self._closed:
            raise MnemeError("this AsyncReplayExecutor was shut down; create a new one")
        self._post(("join", self._dispatch.call(self._connect(address))))

    def retire_server(self, address: str) -> None:
        """Send no new work to ``address``; what it holds is answered, or retried elsewhere if it is gone.

        Args:
            address: its ``host:port``.
        """
        self._post(("retire", address))

    def on_shutdown(self, callback) -> None:
        """Call ``callback()`` when the executor shuts down (a discovery watcher stops with it).

        Args:
            callback: called without arguments, once.
        """
        self._on_shutdown.append(callback)

    # -- connecting (on the loop) ----------------------------------------------------------
    async def _connect_all(self, addresses: list[str]) -> None:
        servers = await asyncio.gather(*(self._connect(address) for address in addresses), return_exceptions=True)
        failed = next((s for s in servers if isinstance(s, BaseException)), None)
        if failed is not None:
            await Channels.close([s for s in servers if isinstance(s, Server)])
            raise failed
        self._scheduler.servers = servers  # (in the loop's thread, before the first round that looks at them)

    async def _connect(self, address: str) -> Server:
        """A server, asked to prepare the instance: restore it on every worker, have every compile process
        read it and compile the compile_ahead code now, not in the first replays (errors surface with those);
        ``wait_prepared()`` waits for it."""
        from replay_server.protocol import replay_pb2
        from replay_server.protocol.convert import config_to_proto

        prepare = replay_pb2.PrepareRequest(instance=self._instance_ref(),
                                            compile=[config_to_proto(config) for _, config in self._ahead])
        return await self._channels.connect(address, prepare)

    def _instance_ref(self) -> Any:
        """The ``InstanceRef`` every request carries (made once per verification setting)."""
        from replay_server.protocol import replay_pb2
        from replay_server.protocol.convert import measurement_to_proto, verification_to_proto

        instance = self._instance
        if instance is None:
            instance = self._instance = replay_pb2.InstanceRef(
                record_db=self.record_key, record_id=self.record_id,
                verification=verification_to_proto(self.verification))
            if self.measurement != MeasurementSettings():  # (the defaults: the message servers knew before)
                instance.measurement.CopyFrom(measurement_to_proto(self.measurement))
        return instance

    # -- dispatching (the loop's thread owns all scheduling state) ------------------------
    def _round(self) -> None:
        """Take the events that are there, then send what can go and deliver what came in."""
        events = self._dispatch.events
        for _ in range(len(events)):  # (the events of this moment; those posted meanwhile wait for the next round)
            self._stopping = self._handle(events.popleft()) or self._stopping
        scheduler = self._scheduler
        if scheduler.pump(time.monotonic(), self._send, self._give_up):
            # an idle server got its first requests: the rest after its stream has sent them
            self._dispatch.post_later(FIRST_MESSAGE_PAUSE, ("pump",))
        self._flush()
        self._deliver()
        if self._stopping and not events and scheduler.idle():
            self._stopping = False  # (once)
            for server in scheduler.servers:
                if server.stream is not None:
                    server.stream.close()
            self._spawn(self._end())

    async def _end(self) -> None:
        """The work is done: close the channels, then stop the loop (``shutdown`` joins its thread)."""
        await Channels.close(self._scheduler.servers)
        self._dispatch.stop()

    def _handle(self, event: tuple) -> bool:
        """One event; True for ``stop``."""
        kind = event[0]
        if kind == "submit":
            self._scheduler.backlog.append(event[1])
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
                self._scheduler.prepared(server, (code for (code, _), error in zip(self._ahead, answer.compile_errors)
                                                  if not error))
        elif kind == "abandon":
            for task in self._scheduler.backlog:
                self._finish(task, ExperimentResult.failure(
                    STATUS_INTERNAL_ERROR, "the executor was shut down before this configuration ran"))
            self._scheduler.backlog.clear()
        elif kind == "join":
            joined = event[1]
            if self._scheduler.join(joined) is not None:  # it came back: the new connection is not needed
                self._spawn(joined.channel.close())
        elif kind == "retire":
            self._scheduler.retire(event[1])
        elif kind == "stop":
            return True  # (kind "pump": a round, nothing to handle)
        return False

    def _send(self, task: Task, server: Server) -> None:
        """``task``'s request to ``server`` (the scheduler counted it): a unary call now, or a place in this
        round's message to its stream."""
        from replay_server.protocol import replay_pb2
        from replay_server.protocol.convert import config_fields

        request = replay_pb2.ReplayRequest(
            request_id=task.request_id,
            instance=self._instance_ref(),
            config=config_fields(task.config),
            iterations=self.iterations,
            warmup=self.warmup,
            timeout_seconds=self.timeout_seconds,
            metrics=self.metrics,
        )
        if self._unary:
            self._channels.replay(task, server, request)
            return
        (server.stream or self._channels.stream(server)).pending[task.request_id] = task
        server.outbox.append(request)

    def _flush(self) -> None:
        """The requests of this round go out, one message per server."""
        for server in self._scheduler.servers:
            if server.outbox:
                server.stream.send(server.outbox)
                server.outbox = []

    def _on_stream_response(self, server: Server, stream: _Stream, response: Any) -> None:
        task = stream.pending.pop(response.request_id, None)
        if task is None:  # not ours, or already answered: nothing to count
            return
        if response.error_code:  # the server could not serve it: as a unary call would have ended
            code = getattr(grpc.StatusCode, response.error_code, grpc.StatusCode.INTERNAL)
            self._on_answer(task, server, code, response.error_message or response.error_code, None)
        else:
            self._on_answer(task, server, _OK, "", response)

    def _on_stream_end(self, server: Server, stream: _Stream, code: grpc.StatusCode, details: str) -> None:
        """The call ended: what it had not answered fails as the call did (retried when the server went
        away), and the next request opens a new call."""
        if server.stream is stream:
            server.stream = None
        if code == _OK:
            code, details = grpc.StatusCode.UNAVAILABLE, "the server ended the stream before answering"
        for task in list(stream.pending.values()):
            self._on_answer(task, server, code, details, None)
        stream.pending.clear()

    def _on_answer(self, task: Task, server: Server, code: grpc.StatusCode, details: str, response: Any) -> None:
        """A server's answer for ``task``: its ReplayResponse (``code`` OK), or the status it failed with."""
        from replay_server.protocol.convert import result_from_proto

        scheduler = self._scheduler
        if code == _OK:
            scheduler.replayed(task, server)
            if response.request_id == task.request_id:
                self._finish(task, result_from_proto(response.result), server.address, response.worker)
                return
            code, details = grpc.StatusCode.INTERNAL, f"response for {response.request_id!r} on our call"
        else:
            scheduler.release(task, server)
        if code not in RETRYABLE:
            if not task.future.done():
                task.future.set_exception(ReplayServerError(f"replay server {server.address}: {code.name}: {details}"))
            return
        why = scheduler.failed(task, server, f"{code.name}: {details}", code in WENT_AWAY, time.monotonic())
        if why is not None:
            self._give_up(task, why)

    def _give_up(self, task: Task, why: str) -> None:
        self._finish(task, ExperimentResult.failure(STATUS_INTERNAL_ERROR, give_up_reason(task, why),
                                                    warmup=self.warmup))

    def _finish(self, task: Task, result: ExperimentResult, server: str = "", worker: str = "") -> None:
        """``task``'s result. Its ``results.jsonl`` line and its future's result wait for the end of the
        round (``_deliver``): a round's results reach the file in one write, before their futures."""
        if task.finished or task.future.done():  # a late duplicate: a result is counted once
            return
        task.finished = True
        log = self._log
        line = "" if log is None else log.line(task.future, task.config, result, server, worker, task.attempts)
        self._finished_now.append((task.future, result, line))
        self._finished += 1
        if self._finished <= 2:  # the first results: the start-up trace's end points (a tuner's baseline, first trial)
            mark("executor", "result", index=self._finished, verified=result.verified)

    def _deliver(self) -> None:
        """The round's results: their lines in one write, then their futures (a waiter finds its line written)."""
        if not self._finished_now:
            return
        finished, self._finished_now = self._finished_now, []
        if self._log is not None:
            self._log.write(line for _, _, line in finished)
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
