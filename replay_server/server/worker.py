"""The worker process: owns the CUDA context and the prepared instances.

Started with the 'spawn' context (a fresh interpreter: no inherited CUDA state
or locks). It pins its GPU, proves the device with the engine's self-test, then
serves messages from the supervisor over a pipe, one at a time:

  supervisor -> worker: ("run", job_id, instance, config_dict, iterations, warmup, compiled, metrics, decision)
                        ("prepare", job_id, instance, decision) | ("stop",)
                                   decision: the instance's reset policy as an earlier worker's proof
                                   decided it (a ResetDecision; None: the worker proves it itself)
                                   metrics: hardware counters to collect after the timed launches
  worker -> supervisor: ("ready", info) | ("failed", reason)            once, at start
                        ("begin", job_id)          the replay starts (watchdog from here)
                        ("result", job_id, result_dict, held_bytes, retiring, kernel_ns)
                                   retiring: the context is lost, the worker exits next
                        ("prepared", job_id, instance_bytes, held_bytes, problem, retiring, kernel_ns)
                                   after "begin": the instance's one-time device work
                                   (``get_ready``) runs under the watchdog; problem: why
                                   the instance cannot replay ('' when it can)
                        ("redo", job_id, decision, held_bytes)
                                   the reset policy's proof lost the context on a second launch
                                   without a reset (a kernel that is not idempotent): the job is
                                   done again by a fresh worker with ``decision``; this one exits
                        ("error", job_id, error_type, message)      the request is at fault

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
    ExperimentConfiguration,
    ExperimentResult,
)

EXIT_CONTEXT_LOST = 3


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
    pin_gpu(gpu)
    from replay_server.server.prepared_cache import PreparedCache

    try:
        threading.Thread(target=spec.warm_up, name="warm-up", daemon=True).start()
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


def _serve(spec: Any, conn: Any, cache: Any, gpu: int) -> None:
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the supervisor is gone
            return
        kind = message[0]
        if kind == "stop":
            return
        job_id, instance, decision = message[1], message[2], message[-1]
        try:
            prepared = cache.get(instance, lambda: spec.open(instance, 0, decision))
        except BaseException as exc:
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
        _, _, _, config_dict, iterations, warmup, compiled, metrics, _ = message
        conn.send(("begin", job_id))
        result = _run(prepared, config_dict, iterations, warmup, compiled, metrics)
        if _redo(conn, job_id, prepared, cache):
            continue
        result.gpu_id = gpu  # the server's GPU index, not the worker's pinned device 0
        retiring = cache.unhealthy()
        conn.send(("result", job_id, result.to_dict(), cache.total_bytes, retiring, prepared.kernel_ns))
        if retiring:
            _retire()


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


def _run(prepared: Any, config_dict: dict, iterations: int, warmup: int, compiled: Any,
         metrics: tuple[str, ...] = ()) -> ExperimentResult:
    try:
        config = ExperimentConfiguration.from_dict(config_dict)
        if not metrics:
            return prepared.run(config, iterations, warmup, compiled)
        if "metrics" not in inspect.signature(prepared.run).parameters:
            result = prepared.run(config, iterations, warmup, compiled)
            result.metrics_error = "hardware counters cannot be collected: this server's engine does not profile"
            return result
        return prepared.run(config, iterations, warmup, compiled, metrics=metrics)
    except Exception as exc:  # the engine promises not to raise; if it does, say so, keep serving
        return ExperimentResult.failure(
            STATUS_INTERNAL_ERROR, f"the replay engine raised {_describe(exc)}", warmup=warmup
        )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, KeyError) and exc.args:
        return f"record id {exc.args[0]!r} is not in this recording database"
    return str(exc) if isinstance(exc, MnemeError) else f"{type(exc).__name__}: {exc}"
