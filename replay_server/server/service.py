"""The mneme.v1.ReplayService servicer: thin over the worker pool.

Requests are validated here (INVALID_ARGUMENT for malformed ones, NOT_FOUND
for objects the store does not hold); a configuration that is well-formed but
cannot launch is not an RPC error: it is answered with an ``invalid_config``
result, as the tuner expects. A caller that cancels takes its queued jobs
with it.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent import futures
from concurrent.futures import CancelledError, Future
from typing import Any, Callable

import grpc

import mneme
from mneme._internal.names import validate_record_id, validate_store_key
from mneme.errors import MnemeError
from mneme.model.experiment import (
    STATUS_INTERNAL_ERROR,
    STATUS_INVALID_CONFIG,
    ExperimentConfiguration,
    ExperimentResult,
)
from mneme.replay.metrics import parse_metric_names
from mneme.store.keys import is_local_store, local_revision, store_has
from replay_server.protocol import replay_pb2, replay_pb2_grpc
from replay_server.protocol.convert import (
    MAX_HOLD_RESPONSES_SECONDS,
    config_from_proto,
    measurement_from_proto,
    result_to_proto,
    verification_from_proto,
)
from replay_server.server.compile_cache import CompileCache
from replay_server.server.engine import DEFAULT_MEASUREMENT, DEFAULT_VERIFICATION, InstanceKey
from replay_server.server.jobs import Job, JobOutcome, RequestError
from replay_server.server.metrics import ServerMetrics
from replay_server.server.worker_pool import WorkerPool

MAX_ITERATIONS = 100_000
MAX_WARMUP = 10_000
MAX_TIMEOUT_SECONDS = 24 * 3600
COMPILER_WARM_SECONDS = 120.0  # Prepare waits this long at most for the compile processes to read the instance
COMPILE_AHEAD_SECONDS = 120.0  # and this long at most for the compiles its request lists
MAX_COMPILE_AHEAD = 4096  # configurations one Prepare may ask to compile (the compile cache's size)
REVISION_CHECK_S = 1.0  # how often a local database file is looked at again (rewritten: a new revision)
MAX_RESPONSES_PER_MESSAGE = 1024  # a held message goes out once it carries this many
MAX_VERIFICATIONS = 256  # distinct verification settings whose checked key the service keeps
# InstanceRef's fields before `verification` (reserved in replay.proto): a request carrying any is refused.
_OLD_VERIFICATION_FIELDS = {3: "tolerance", 4: "tolerance_runs", 5: "tolerance_overrides", 6: "no_relocate"}


class ReplayService(replay_pb2_grpc.ReplayServiceServicer):
    def __init__(
        self,
        pool: WorkerPool,
        store: str,
        metrics: ServerMetrics,
        watchdog: float,
        engine_name: str,
        compile_cache: CompileCache | None = None,
    ) -> None:
        self.pool = pool
        self.store = store
        self.metrics = metrics
        self.watchdog = watchdog
        self.engine_name = engine_name
        self.compile_cache = compile_cache
        self._local = is_local_store(store)
        self._known_keys: dict[str, tuple[str, float]] = {}  # key -> (revision, when looked at)
        self._verifications: dict[bytes, str] = {}  # a Verification message's bytes -> its settings' key, checked
        self._measurements: dict[bytes, str] = {}  # the same for Measurement messages

    # -- request checking ------------------------------------------------------------
    def _instance(self, ref: replay_pb2.InstanceRef) -> InstanceKey:
        try:
            key = validate_store_key(ref.record_db)
            record_id = validate_record_id(ref.record_id)
        except MnemeError as exc:
            raise RequestError("INVALID_ARGUMENT", str(exc)) from exc
        revision = self._revision(key)
        return InstanceKey(self.store, key, record_id, self._verification(ref), revision, self._measurement(ref))

    def _measurement(self, ref: replay_pb2.InstanceRef) -> str:
        """The key of the measurement settings ``ref`` carries (checked once per distinct settings)."""
        if not ref.HasField("measurement"):
            return DEFAULT_MEASUREMENT
        return _settings_key(self._measurements, ref.measurement, measurement_from_proto, "measurement")

    def _verification(self, ref: replay_pb2.InstanceRef) -> str:
        """The key of the verification settings ``ref`` carries, checked through the converter once per
        distinct settings (a client sends the same ones with every request)."""
        if not ref.HasField("verification"):
            _refuse_old_verification_fields(ref)
            return DEFAULT_VERIFICATION
        return _settings_key(self._verifications, ref.verification, verification_from_proto, "verification")

    def _revision(self, key: str) -> str:
        """The database's revision (a local store's file: looked at again after REVISION_CHECK_S); NOT_FOUND
        when the store does not hold it."""
        now = time.monotonic()
        known = self._known_keys.get(key)
        if known is not None and (not self._local or now - known[1] < REVISION_CHECK_S):
            return known[0]
        try:
            revision = local_revision(self.store, key) if self._local else ("" if store_has(self.store, key) else None)
        except MnemeError as exc:
            raise RequestError("INVALID_ARGUMENT", str(exc)) from exc
        except Exception as exc:  # the store itself failed (S3 down, ...)
            raise RequestError("UNAVAILABLE", f"cannot reach the store {self.store}: {exc}") from exc
        if revision is None:
            self._known_keys.pop(key, None)
            raise RequestError(
                "NOT_FOUND",
                f"the store {self.store} has no recording database {key!r}; push it there first (mneme push)",
            )
        self._known_keys[key] = (revision, now)
        return revision

    def _job(self, request: replay_pb2.ReplayRequest) -> Job | ExperimentResult:
        """A queued job, or the immediate result of a configuration that cannot launch."""
        if not request.HasField("instance"):
            raise RequestError("INVALID_ARGUMENT", "the request names no instance (record_db, record_id)")
        if not request.HasField("config"):
            raise RequestError("INVALID_ARGUMENT", "the request carries no configuration")
        if not 1 <= request.iterations <= MAX_ITERATIONS:
            raise RequestError("INVALID_ARGUMENT", f"iterations must be 1..{MAX_ITERATIONS}, got {request.iterations}")
        if request.warmup > MAX_WARMUP:
            raise RequestError("INVALID_ARGUMENT", f"warmup must be 0..{MAX_WARMUP}, got {request.warmup}")
        if not 0 <= request.timeout_seconds <= MAX_TIMEOUT_SECONDS:
            raise RequestError("INVALID_ARGUMENT", f"timeout_seconds must be 0..{MAX_TIMEOUT_SECONDS}")
        instance = self._instance(request.instance)
        try:
            config = config_from_proto(request.config)
        except MnemeError as exc:
            raise RequestError("INVALID_ARGUMENT", f"unreadable configuration: {exc}") from exc
        try:
            counters = parse_metric_names(request.metrics) if request.metrics else ()
        except MnemeError as exc:
            raise RequestError("INVALID_ARGUMENT", str(exc)) from exc
        invalid = _why_invalid(config)
        if invalid:
            self.metrics.count_result(STATUS_INVALID_CONFIG, True, False)
            return ExperimentResult.failure(
                STATUS_INVALID_CONFIG, invalid, warmup=request.warmup, gpu_id=self.pool.settings.gpu,
            )
        job = Job(
            "run", instance, config, iterations=request.iterations, warmup=request.warmup,
            timeout=request.timeout_seconds or self.watchdog, derived_watchdog=not request.timeout_seconds,
            metrics=counters,
        )
        return self.pool.submit(job)  # its compile starts now, ahead of the GPU

    # -- RPCs --------------------------------------------------------------------------
    def Replay(self, request, context):
        try:
            job = self._job(request)
        except RequestError as exc:
            _abort(context, exc)
        if isinstance(job, ExperimentResult):
            return replay_pb2.ReplayResponse(request_id=request.request_id, result=result_to_proto(job))
        context.add_callback(job.future.cancel)  # a caller that hangs up drops its queued job
        try:
            outcome = job.future.result()
        except CancelledError:
            context.abort(grpc.StatusCode.CANCELLED, "cancelled by the caller")
        except RequestError as exc:
            _abort(context, exc)
        return _response(request.request_id, outcome)

    def ReplayStream(self, request_iterator, context):
        for responses in self._serve_stream((((request,), 0.0) for request in request_iterator), context):
            yield from responses

    def ReplayBatchStream(self, batch_iterator, context):
        batches = ((batch.requests, batch.hold_responses_seconds) for batch in batch_iterator)
        for responses in self._serve_stream(batches, context):
            yield replay_pb2.ReplayResponseBatch(responses=responses)

    def _serve_stream(self, batches, context):
        """The work of a stream: requests come in groups (``batches`` of (requests, hold seconds)), and the
        responses ready at the same time are yielded together, as they complete; the client's hold
        (``ReplayBatch.hold_responses_seconds``) lets more join them while the stream has requests
        waiting in the queue. A request that cannot be served gets an error response and does not end
        the others; the caller hanging up drops the requests still queued."""
        responses: "queue.Queue[replay_pb2.ReplayResponse]" = queue.Queue()
        pending: dict[int, Job] = {}
        lock = threading.Lock()
        reading_done = threading.Event()
        hold = [0.0]  # the client's latest hold_responses_seconds

        def finished(request_id: str, job: Job, future: Future) -> None:
            with lock:
                pending.pop(job.id, None)
            if future.cancelled():
                return
            error = future.exception()
            if error is None:
                responses.put(_response(request_id, future.result()))
            else:
                responses.put(_error_response(request_id, error, self.pool.settings.gpu))

        def take(request: replay_pb2.ReplayRequest) -> None:
            try:
                job = self._job(request)
            except RequestError as exc:
                responses.put(_error_response(request.request_id, exc, self.pool.settings.gpu))
                return
            if isinstance(job, ExperimentResult):
                responses.put(replay_pb2.ReplayResponse(request_id=request.request_id, result=result_to_proto(job)))
                return
            with lock:
                pending[job.id] = job
            job.future.add_done_callback(lambda f, rid=request.request_id, j=job: finished(rid, j, f))

        def read_requests() -> None:
            try:
                for batch, hold_seconds in batches:
                    hold[0] = min(max(hold_seconds, 0.0), MAX_HOLD_RESPONSES_SECONDS)
                    for request in batch:
                        take(request)
            except Exception:  # the caller went away mid-stream
                pass
            finally:
                reading_done.set()

        def cancel_all() -> None:
            with lock:
                jobs = list(pending.values())
            for job in jobs:
                job.future.cancel()

        def some_queued() -> bool:
            """A request of this stream still waits in the queue: the workers have work while responses wait
            (and each has its next job in hand while the client answers the ones sent then)."""
            with lock:
                return any(not job.started for job in pending.values())

        context.add_callback(cancel_all)
        reader = threading.Thread(target=read_requests, name="stream-reader", daemon=True)
        reader.start()
        while context.is_active():
            try:
                ready = [responses.get(timeout=0.1)]
            except queue.Empty:
                with lock:
                    idle = not pending
                if reading_done.is_set() and idle and responses.empty():
                    return
                continue
            _take_ready(responses, ready)  # and whatever else is ready now
            if hold[0]:  # and what comes while the queue keeps the workers busy, for the client's hold at most
                deadline = time.monotonic() + hold[0]
                while len(ready) < MAX_RESPONSES_PER_MESSAGE and some_queued():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        ready.append(responses.get(timeout=left))
                    except queue.Empty:
                        break
                    _take_ready(responses, ready)
            yield ready

    def Prepare(self, request, context):
        """Restore the instance on every worker; meanwhile the compile processes read it and compile the
        code of ``request.compile`` (when the GPU arch is not known yet, once the workers report it)."""
        try:
            if not request.HasField("instance"):
                raise RequestError("INVALID_ARGUMENT", "the request names no instance (record_db, record_id)")
            if len(request.compile) > MAX_COMPILE_AHEAD:
                raise RequestError("INVALID_ARGUMENT", f"Prepare lists {len(request.compile)} configurations to "
                                   f"compile; at most {MAX_COMPILE_AHEAD} (one per code variant is enough)")
            instance = self._instance(request.instance)
            jobs = self.pool.prepare_everywhere(lambda: Job("prepare", instance, timeout=self.watchdog))
            compiling = self._compile_ahead(instance, request.compile) if self.pool.arch else None
            outcomes: list[JobOutcome] = [job.future.result() for job in jobs]
        except RequestError as exc:
            _abort(context, exc)
        if compiling is None:
            compiling = self._compile_ahead(instance, request.compile)
        return replay_pb2.PrepareResponse(
            device_bytes=max(o.device_bytes for o in outcomes), workers_prepared=len(outcomes),
            compile_errors=_compile_errors(compiling),
        )

    def _compile_ahead(self, instance: InstanceKey, configs) -> list[Future | str]:
        """Every compile process reads the instance (a warm-up that fails is ignored: the same failure
        comes back with the compile that needs it); then the compiles of ``configs`` start, each behind
        every replay's compile. Per configuration: the future of its product, or why there is none ("" for
        the recorded launch's code, which the workers hold).

        The compile processes start and read the instance only where they pay: when ``configs`` names
        code other than the recorded launch's, or names nothing (the client did not say what it will
        need). A client that lists only the recorded code (a launch-shape space) starts none; a compile
        asked for later starts its process then."""
        cache, arch = self.compile_cache, self.pool.arch
        if cache is None or not arch:
            why = "this server has no compile pool" if cache is None else "no worker has reported the GPU yet"
            return [f"{why}: the replay compiles its code" for _ in configs]
        # per configuration: one to compile, why it cannot be, or "" for the recorded code (nothing to compile)
        parsed: list[ExperimentConfiguration | str] = []
        for message in configs:
            try:
                config = config_from_proto(message)
            except MnemeError as exc:
                parsed.append(f"unreadable configuration: {exc}")
                continue
            invalid = _why_invalid(config)
            parsed.append(invalid or ("" if config.runs_recorded_code() else config))
        new_code = any(isinstance(c, ExperimentConfiguration) for c in parsed)
        warming = cache.warm(instance, arch) if new_code or not configs else []
        compiling: list[Future | str] = [
            c if isinstance(c, str) else cache.request_counted(instance, c, arch, ahead=True)[0] for c in parsed]
        futures.wait(warming, timeout=COMPILER_WARM_SECONDS)
        return compiling

    def GetServerInfo(self, request, context):
        capabilities = ["replay", "stream", "batch-stream", "prepare", "watchdog", "fault-isolation", "metrics"]
        cache = self.compile_cache
        if cache is not None:
            capabilities.append("compile-pool")
        return replay_pb2.ServerInfo(
            version=mneme.__version__,
            gpu=self.pool.settings.gpu,
            engine=self.engine_name,
            workers=len(self.pool.slots),
            workers_ready=self.pool.workers_ready,
            queue_depth=len(self.pool.queue),
            in_flight=max(self.pool.in_flight, 0),
            replays_completed=self.pool.completed,
            worker_restarts=self.pool.restarts,
            compile_cache_entries=len(cache) if cache else 0,
            compile_cache_hits=cache.hits if cache else 0,
            compile_cache_misses=cache.misses if cache else 0,
            prepared_instance_bytes=self.pool.held_bytes,
            capabilities=capabilities,
            store=_public_url(self.store),
            watchdog_seconds=self.watchdog,
            gpu_name=str(self.pool.device.get("name", "")),
            arch=str(self.pool.device.get("arch", "")),
            gpu_memory_bytes=int(self.pool.device.get("total_memory", 0) or 0),
        )


def _settings_key(known: dict[bytes, str], msg: Any, from_proto: Callable[[Any], Any], what: str) -> str:
    """The key of the settings a ``Verification`` or ``Measurement`` message carries, converted and checked
    once per distinct message (``known``: its bytes -> the key; a client sends the same with every request).

    Raises:
        RequestError: INVALID_ARGUMENT, with the converter's reason.
    """
    wire = msg.SerializeToString()
    key = known.get(wire)
    if key is None:
        try:
            key = from_proto(msg).key()
        except MnemeError as exc:
            raise RequestError("INVALID_ARGUMENT", f"instance {what}: {exc}") from exc
        if len(known) >= MAX_VERIFICATIONS:
            known.clear()
        known[wire] = key
    return key


def _refuse_old_verification_fields(ref: replay_pb2.InstanceRef) -> None:
    """A client older than ``InstanceRef.verification`` that asked for other than the default settings sent
    them in fields this server no longer reads: refuse its request rather than verify it another way."""
    from google.protobuf.unknown_fields import UnknownFieldSet

    old = sorted({_OLD_VERIFICATION_FIELDS[f.field_number] for f in UnknownFieldSet(ref)
                  if f.field_number in _OLD_VERIFICATION_FIELDS})
    if old:
        raise RequestError("INVALID_ARGUMENT", f"the request sets {', '.join(old)}, which this server no longer "
                           f"reads (mneme {mneme.__version__} takes InstanceRef.verification): update the client")


def _take_ready(responses: "queue.Queue", ready: list) -> None:
    """Move the responses already waiting in ``responses`` to ``ready``."""
    while True:
        try:
            ready.append(responses.get_nowait())
        except queue.Empty:
            return


def _why_invalid(config) -> str:
    """Why ``config`` cannot launch ("" when it can)."""
    errors = config.validation_errors()
    return "invalid configuration: " + "; ".join(errors) if errors else ""


def _compile_errors(compiling: list[Future | str]) -> list[str]:
    """``PrepareResponse.compile_errors``: "" for each compiled product, else why there is none."""
    pending = [c for c in compiling if isinstance(c, Future)]
    futures.wait(pending, timeout=COMPILE_AHEAD_SECONDS)
    errors = []
    for outcome in compiling:
        if isinstance(outcome, str):
            errors.append(outcome)
        elif not outcome.done():
            errors.append(f"still compiling after {COMPILE_AHEAD_SECONDS:g} s; a replay of it waits for the compile")
        elif outcome.cancelled() or outcome.exception() is not None:
            error = "the compile was cancelled" if outcome.cancelled() else str(outcome.exception())
            errors.append(f"compile failed: {error}")
        else:
            errors.append("")
    return errors


def _response(request_id: str, outcome: JobOutcome) -> replay_pb2.ReplayResponse:
    """The response of a finished job: its result as the worker serialized it (parsed in C, not converted
    from the model again), or the model's result converted."""
    result = (replay_pb2.Result.FromString(outcome.result_bytes) if outcome.result_bytes
              else result_to_proto(outcome.result))
    return replay_pb2.ReplayResponse(
        request_id=request_id,
        result=result,
        worker=outcome.worker,
        queued_seconds=outcome.queued_seconds,
        server_seconds=outcome.server_seconds,
    )


def _error_response(request_id: str, error: BaseException, gpu: int) -> replay_pb2.ReplayResponse:
    """In a stream, one bad request must not end the others: it gets a response with the status a unary
    call would have ended with (``error_code``, which clients act on: retry elsewhere, or raise), and a
    failed result saying the same for clients that only read results."""
    code = getattr(error, "code", "INTERNAL")
    result = ExperimentResult.failure(STATUS_INTERNAL_ERROR, f"{code}: {error}", gpu_id=gpu)
    return replay_pb2.ReplayResponse(request_id=request_id, result=result_to_proto(result),
                                     error_code=code, error_message=str(error))


def _abort(context: grpc.ServicerContext, error: RequestError) -> None:
    context.abort(getattr(grpc.StatusCode, error.code, grpc.StatusCode.INTERNAL), str(error))


def _public_url(url: str) -> str:
    """The store URL without credentials (user:secret@host)."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        rest = rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"


