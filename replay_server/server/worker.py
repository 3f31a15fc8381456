"""The worker process: owns the CUDA context and the prepared instances.

Started with the 'spawn' context (a fresh interpreter: no inherited CUDA state
or locks). It pins its GPU, proves the device with the engine's self-test, then
serves messages from the supervisor over a pipe, one at a time:

  supervisor -> worker: ("runs", instance, decision, [(job_id, config, iterations, warmup, compiled, metrics), ...])
                                   config: the configuration's fields as a tuple (``pack_config``)
                                   several configurations of one instance, replayed together
                                   (``PreparedInstance.run_many`` where the engine has it: one engine
                                   call) and answered together (a job with metrics comes alone)
                        ("prepare", job_id, instance, decision) | ("stop",)
                                   decision: the instance's reset policy as an earlier worker's proof
                                   decided it (a ResetDecision; None: the worker proves it itself)
                                   metrics: hardware counters to collect after the timed launches
  worker -> supervisor: ("ready", info) | ("failed", reason)            once, at start
                        ("begin", job_id)          the replay starts (watchdog from here)
                        ("results", [(job_id, result_bytes, summary), ...], held_bytes, retiring, kernel_ns)
                                   result_bytes: the ``Result`` message, serialized (the supervisor sends
                                   it on as it is); summary: (status, failed, verified, executed, mean
                                   measured ns) for its metrics; retiring: the context is lost, the
                                   worker exits next (the configurations without a result are innocent)
                        ("lost", job_id)
                                   the context was lost in an engine call shared by several
                                   configurations: which one is not known; each is replayed alone
                        ("prepared", job_id, instance_bytes, held_bytes, problem, retiring, kernel_ns)
                                   after "begin": the instance's one-time device work
                                   (``get_ready``) runs under the watchdog; problem: why
                                   the instance cannot replay ('' when it can)
                        ("redo", job_id, decision, held_bytes)
                                   the reset policy's proof lost the context on a second launch
                                   without a reset (a kernel that is not idempotent): the job is
                                   done again by a fresh worker with ``decision``; this one exits
                        ("error", job_id, error_type, message)      the request is at fault
A message's job_id is that of the first job it answers (the supervisor's head of line).

A replay that leaves the context unusable (``healthy`` False) is answered,
then the worker exits so that the supervisor starts a fresh one.
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
import threading
from typing import Any

from mneme._internal.startup_trace import mark
from mneme.errors import MnemeError
from mneme.model.experiment import (
    STATUS_INTERNAL_ERROR,
    Dim3,
    ExperimentConfiguration,
    ExperimentResult,
)
from replay_server.server.parent import name_process

EXIT_CONTEXT_LOST = 3
POLL_SECONDS = 0.0002  # how often a worker with a group on the GPU looks for the next message meanwhile


def pack_config(config: ExperimentConfiguration) -> tuple:
    """A configuration as the pipe carries it: its fields in order, the extents flat (a tuple pickles
    and reads back in a fraction of a dict's time, and ``unpack_config`` checks nothing again).

    Args:
        config: a configuration (validated by the service).

    Returns:
        The tuple.
    """
    g, b = config.grid, config.block
    return (g.x, g.y, g.z, b.x, b.y, b.z, config.shared_mem, config.specialize, config.set_launch_bounds,
            config.max_threads, config.min_blocks_per_sm, config.specialize_dims, config.passes,
            config.codegen_opt, config.codegen_method, config.prune, config.internalize)


def unpack_config(fields: tuple) -> ExperimentConfiguration:
    """The configuration ``pack_config`` made ``fields`` of.

    Args:
        fields: the tuple.

    Returns:
        The configuration.
    """
    return ExperimentConfiguration(Dim3(*fields[0:3]), Dim3(*fields[3:6]), *fields[6:])


def pin_gpu(gpu: int) -> None:
    """Make ``gpu`` (an index among the GPUs the server sees) this process's device 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        entries = [v for v in visible.split(",") if v.strip()]
        if gpu < len(entries):
            os.environ["CUDA_VISIBLE_DEVICES"] = entries[gpu]
            return
    os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when the supervisor dies, even if it is stuck in a kernel."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pipe's EOF still ends an idle worker
        pass


def cache_budget(cache_bytes: int, info: dict, workers_on_gpu: int) -> int:
    """The prepared-instance budget: as configured, or (0) half the device memory shared by its workers."""
    if cache_bytes > 0:
        return cache_bytes
    total = int(info.get("total_memory") or 0)
    return total // 2 // max(workers_on_gpu, 1) if total else 8 << 30


def worker_main(spec: Any, gpu: int, conn: Any, cache_bytes: int, workers_on_gpu: int = 1) -> None:
    mark("worker", "start")
    die_with_parent()
    name_process("mneme-worker")
    pin_gpu(gpu)
    from replay_server.server.prepared_cache import PreparedCache

    try:
        threading.Thread(target=_warm_up, args=(spec,), name="warm-up", daemon=True).start()
        try:
            info = spec.self_test(0) or {}
        except BaseException as exc:  # the self-test is the gate: any failure keeps this worker out
            conn.send(("failed", f"self-test failed: {type(exc).__name__}: {exc}"))
            return
        mark("worker", "self_test")
        conn.send(("ready", info))
        cache: PreparedCache = PreparedCache(cache_budget(cache_bytes, info, workers_on_gpu))
        try:
            _serve(spec, conn, cache, gpu)
        finally:
            cache.close()
    except (BrokenPipeError, EOFError, ConnectionResetError):  # the supervisor went away: nothing to report to
        return


def _warm_up(spec: Any) -> None:
    """The engine's imports, and the wire form results leave in, beside the driver's start."""
    spec.warm_up()
    import replay_server.protocol.convert  # noqa: F401


def _serve(spec: Any, conn: Any, cache: Any, gpu: int) -> None:
    """Serve the supervisor's messages. A group of configurations of an instance whose engine enqueues
    without waiting (``start_many``) stays pending on the GPU while the next message's group is enqueued
    behind it, so the GPU goes from one group to the next without waiting for this process; a group's
    answers go out once the next group is enqueued, or at once when no message waits."""
    from replay_server.protocol.convert import result_to_proto

    def answer(job_id: int, jobs: list, prepared: Any, batch: Any, behind: bool = False) -> None:
        """Send the results of ``batch``; ``behind``: another group is enqueued after it on the GPU (a
        configuration whose verdict needs a replay of its own is then not answered: the supervisor
        replays it alone, with nothing behind it)."""
        try:
            # (a batch that does not say ``enqueued`` predates ``enqueued_behind`` too)
            results = batch.results(enqueued_behind=True) if behind and hasattr(batch, "enqueued") else batch.results()
        except Exception as exc:
            if type(exc).__name__ != "BatchLost":
                raise
            conn.send(("lost", job_id))
            _retire()
        if _redo(conn, job_id, prepared, cache):
            return
        answers = []
        for (one_id, *_), result in zip(jobs, results):
            if result is None:  # not judged here (see ReplayBatch.results): given back, replayed alone
                continue
            result.gpu_id = gpu  # the server's GPU index, not the worker's pinned device 0
            measured = result.measured_times if result.executed else []
            summary = (result.status, result.failed, result.verified, result.executed,
                       sum(measured) / len(measured) if measured else 0.0)
            answers.append((one_id, result_to_proto(result).SerializeToString(), summary))
            if not prepared.healthy:  # the context is gone: the configurations after it are innocent
                break
        retiring = cache.unhealthy()
        conn.send(("results", answers, cache.total_bytes, retiring, prepared.kernel_ns))
        if retiring:
            _retire()

    pending: tuple | None = None  # (job_id, jobs, prepared, batch): enqueued, not answered yet
    while True:
        if pending is not None and (not _enqueued(pending[3]) or not _next_comes_first(conn, pending[3])):
            # nothing to enqueue behind it, or its replays are not enqueued yet (its results() makes them:
            # they must not wait for a group enqueued behind)
            answer(*pending)
            pending = None
            continue
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the supervisor is gone
            return
        kind = message[0]
        if pending is not None and kind != "runs":
            answer(*pending)
            pending = None
        if kind == "stop":
            return
        if kind == "runs":
            _, instance, decision, jobs = message
            job_id = jobs[0][0]
        else:
            job_id, instance, decision = message[1], message[2], message[-1]
        try:
            prepared = cache.get(instance, lambda: spec.open(instance, 0, decision))
        except BaseException as exc:
            if pending is not None:
                answer(*pending)
                pending = None
            conn.send(("error", job_id, type(exc).__name__, _describe(exc)))
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            continue
        if kind == "prepare":
            mark("worker", "restored")
            conn.send(("begin", job_id))
            problem = prepared.get_ready()
            mark("worker", "prepared")
            if _redo(conn, job_id, prepared, cache):
                continue
            retiring = cache.unhealthy()
            conn.send(("prepared", job_id, prepared.device_bytes, cache.total_bytes, problem, retiring,
                       prepared.kernel_ns))
            if retiring:
                _retire()
            continue
        if getattr(prepared, "start_many", None) is None or any(job[5] for job in jobs):
            # one by one, now ("begin" arms the watchdog first); hardware counters: profiled after its own launches
            if pending is not None:
                answer(*pending)
                pending = None
            conn.send(("begin", job_id))
            answer(job_id, jobs, prepared, _Done(_run_many(prepared, jobs)))
            continue
        if pending is None:
            conn.send(("begin", job_id))
        try:
            batch = _start_many(prepared, jobs)
        except _Lost:
            conn.send(("lost", pending[0] if pending is not None else job_id))
            _retire()
        if pending is not None:
            # (the new group's start waited for nothing enqueued after the pending one's last event: its
            # replays are enqueued behind it, or made later, by its results())
            answer(*pending, behind=_enqueued(batch))
            conn.send(("begin", job_id))  # (after the answers of the one before: the supervisor's head of line)
        pending = (job_id, jobs, prepared, batch)


def _enqueued(batch: Any) -> bool:
    """Whether ``batch``'s GPU work is all enqueued, so that its ``results()`` wait for nothing enqueued after
    it (an engine's batch without ``enqueued`` says so by its ``start_many``)."""
    return bool(getattr(batch, "enqueued", True))


def _next_comes_first(conn: Any, batch: Any) -> bool:
    """Whether a message arrives while the GPU still runs ``batch`` (its group is then enqueued behind it,
    and the GPU goes on to it without waiting for this process); False once the batch is done."""
    ready = getattr(batch, "ready", None)
    if conn.poll():
        return True
    while ready is not None and not ready():
        if conn.poll(POLL_SECONDS):
            return True
    return False


class _Lost(Exception):
    """An engine call shared by several configurations lost the context (which one is not known)."""


class _Done:
    """Results already there, as a batch gives them (``results()``)."""

    enqueued = True

    def __init__(self, results: list[ExperimentResult]) -> None:
        self._results = results

    def results(self, enqueued_behind: bool = False) -> list[ExperimentResult]:
        return self._results


class _Later:
    """Replays made when their results are taken (``results()``), not when they are started: the group
    before them is answered first (``enqueued`` False: nothing is enqueued behind them either)."""

    enqueued = False

    def __init__(self, make: Any) -> None:
        self._make, self._results = make, None

    def results(self, enqueued_behind: bool = False) -> list[ExperimentResult]:
        if self._results is None:
            self._results = self._make()
        return self._results


def _requests(jobs: list) -> list[tuple]:
    """(configuration, iterations, warmup, compiled) of each job; a configuration that does not parse is
    its exception (its replay reports it)."""
    requests = []
    for _, fields, iterations, warmup, compiled, _metrics in jobs:
        try:
            requests.append((unpack_config(fields), iterations, warmup, compiled))
        except Exception as exc:  # a configuration the supervisor let through: its own failed result
            requests.append((exc, iterations, warmup, compiled))
    return requests


def _start_many(prepared: Any, jobs: list) -> Any:
    """``jobs`` enqueued on the GPU in one engine call (``start_many``): the batch whose ``results()`` wait
    for them (a job whose configuration does not parse makes them run one by one, now)."""
    requests = _requests(jobs)
    if any(isinstance(r[0], Exception) for r in requests):
        return _Later(lambda: _run_many(prepared, jobs))
    try:
        return prepared.start_many(requests)
    except Exception as exc:
        if type(exc).__name__ == "BatchLost":
            raise _Lost(str(exc)) from None
        return _Done([_engine_raised(exc, r[2]) for r in requests])


def _run_many(prepared: Any, jobs: list) -> list[ExperimentResult]:
    """The results of ``jobs`` ((job_id, config fields, iterations, warmup, compiled, metrics) each): one engine call
    where the instance replays several at once (``run_many``), else one by one, stopping at a result
    that lost the context."""
    requests = _requests(jobs)
    many = getattr(prepared, "run_many", None)
    if (many is not None and len(requests) > 1 and not any(isinstance(r[0], Exception) for r in requests)
            and not any(job[5] for job in jobs)):
        try:
            return many(requests)
        except Exception as exc:
            if type(exc).__name__ == "BatchLost":
                raise _Lost(str(exc)) from None
            return [_engine_raised(exc, r[2]) for r in requests]
    results = []
    for (config, iterations, warmup, compiled), job in zip(requests, jobs):
        results.append(_run(prepared, config, iterations, warmup, compiled, job[5]))
        if not prepared.healthy:
            break
    return results


def _redo(conn: Any, job_id: int, prepared: Any, cache: Any) -> bool:
    """When the reset policy's proof lost the context on a second launch without a reset: the job is done
    again by a fresh worker that resets before every launch (this one exits). False otherwise."""
    decision = prepared.fallback() if not prepared.healthy else None
    if decision is None:
        return False
    conn.send(("redo", job_id, decision, cache.total_bytes))
    _retire()
    return True


def _retire() -> None:
    sys.stdout.flush()
    os._exit(EXIT_CONTEXT_LOST)  # the context is gone: no cleanup can succeed


def _run(prepared: Any, config: Any, iterations: int, warmup: int, compiled: Any,
         metrics: tuple[str, ...] = ()) -> ExperimentResult:
    try:
        if isinstance(config, Exception):
            raise config
        if not metrics:
            return prepared.run(config, iterations, warmup, compiled)
        if "metrics" not in inspect.signature(prepared.run).parameters:
            result = prepared.run(config, iterations, warmup, compiled)
            result.metrics_error = "hardware counters cannot be collected: this server's engine does not profile"
            return result
        return prepared.run(config, iterations, warmup, compiled, metrics=metrics)
    except Exception as exc:  # the engine promises not to raise; if it does, say so, keep serving
        return _engine_raised(exc, warmup)


def _engine_raised(exc: Exception, warmup: int) -> ExperimentResult:
    return ExperimentResult.failure(STATUS_INTERNAL_ERROR, f"the replay engine raised {_describe(exc)}", warmup=warmup)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, KeyError) and exc.args:
        return f"record id {exc.args[0]!r} is not in this recording database"
    return str(exc) if isinstance(exc, MnemeError) else f"{type(exc).__name__}: {exc}"
