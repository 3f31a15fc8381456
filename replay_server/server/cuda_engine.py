"""The real engine: prepared instances are ``mneme.replay.Replayer`` objects.

Runs inside worker processes only (it touches CUDA); the compile function runs
in the CPU compile pool, which has no GPU context.
"""

from __future__ import annotations

import functools
import inspect
import time
from dataclasses import dataclass
from typing import Any

from mneme._internal.startup_trace import mark
from mneme.model.experiment import ExperimentConfiguration, ExperimentResult
from mneme.store.keys import is_local_store, resolve_in_store
from replay_server.server.engine import CompileFunction, InstanceKey


@functools.lru_cache(maxsize=16)
def _load_recording(store: str, record_db: str, revision: str = ""):
    """The recording ``record_db`` of ``store`` (at ``revision``: a database rewritten since is read again).

    A remote store is read through the local content-addressed chunk cache
    (``$MNEME_CACHE_DIR``), so the workers of a machine, and the workers that
    replace them, fetch each chunk from the network once.
    """
    from mneme.recording.execution import RecordedExecution

    location = resolve_in_store(store, record_db)  # validates the key
    if is_local_store(store):
        return RecordedExecution.from_json(location)
    from mneme.store.cache import (
        cached_store,  # (imports the S3 client: only for remote stores)
    )

    return RecordedExecution.from_store(cached_store(store), record_db)


class CudaPreparedInstance:
    """One ``Replayer``: the instance's memory restored on this worker's GPU."""

    def __init__(self, replayer: Any) -> None:
        self._replayer = replayer
        # Precompiled code from the pool is handed over when the engine accepts it.
        self._accepts_compiled = "compiled" in inspect.signature(replayer.run).parameters

    @property
    def device_bytes(self) -> int:
        return int(self._replayer.device_bytes)

    @property
    def healthy(self) -> bool:
        return bool(self._replayer.healthy)

    def get_ready(self) -> str:
        return self._replayer.get_ready()  # the reset policy's proof: two launches of the recorded baseline

    def fallback(self) -> Any:
        return self._replayer.fallback()

    @property
    def kernel_ns(self) -> int | None:
        return self._replayer.kernel_ns

    def run(
        self, config: ExperimentConfiguration, iterations: int, warmup: int, compiled: Any = None,
        metrics: tuple[str, ...] = (),
    ) -> ExperimentResult:
        extra = {"metrics": metrics} if metrics else {}
        if compiled is not None and self._accepts_compiled:
            return self._replayer.run(config, iterations=iterations, warmup=warmup, compiled=compiled, **extra)
        return self._replayer.run(config, iterations=iterations, warmup=warmup, **extra)

    def start_many(self, requests: list[tuple]) -> Any:
        """Enqueue several configurations in one engine call (``Replayer.start_many``): the returned batch's
        ``results()`` waits for them; meanwhile the next batch can be enqueued.

        Args:
            requests: (configuration, iterations, warmup, compiled code or None) per configuration.

        Returns:
            The batch.
        """
        return self._replayer.start_many(requests)

    def run_many(self, requests: list[tuple]) -> list[ExperimentResult]:
        """``start_many(requests).results()``.

        Args:
            requests: (configuration, iterations, warmup, compiled code or None) per configuration.

        Returns:
            One result per request.
        """
        return self._replayer.run_many(requests)

    def close(self) -> None:
        self._replayer.close()


def compile_in_pool(instance: InstanceKey, config: dict, arch: str) -> Any:
    """CPU-only: the code ``config`` needs, for the compile pool (cached by the supervisor).

    The recorded launch's configuration is how ``Prepare`` warms each compile process: it also starts
    the PTX compiler there, so the first recompile of a sweep costs only its own compile.
    """
    from mneme.replay.compile import compile_for, needs_recompile, warm_up

    started = time.monotonic()
    recording = _load_recording(instance.store, instance.record_db, instance.revision)
    wanted = ExperimentConfiguration.from_dict(config)
    if not needs_recompile(wanted) and recording.code.ptx is not None:
        warm_up(arch)
    product = compile_for(recording, recording[instance.record_id], wanted, arch)
    mark("compile", "compiled", seconds=time.monotonic() - started)
    return product


@dataclass(frozen=True)
class CudaEngineSpec:
    name: str = "cuda"

    def warm_up(self) -> None:
        # The replay stack (the snapshot and chunk readers, the recording's model, the replayer): a large
        # share of a worker's start, imported beside the driver's start and the CUDA context (which release
        # the GIL).
        import mneme.recording.execution  # noqa: F401
        import mneme.replay.replayer  # noqa: F401
        import mneme.replay.tolerance  # noqa: F401
        from mneme._internal import nvml

        nvml.unavailable_reason()  # NVML's import and init (the replays' conditions) beside the driver's start

    def self_test(self, device: int) -> dict:
        from mneme._internal.devices import query_device
        from mneme.replay import self_test

        self_test(device=device)
        return query_device(device)

    def open(self, instance: InstanceKey, device: int, reset_decision: Any = None) -> CudaPreparedInstance:
        from mneme.replay import Replayer

        recording = _load_recording(instance.store, instance.record_db, instance.revision)
        mark("worker", "recording")
        if instance.record_id not in recording:  # NOT_FOUND for the caller, before any device work
            raise KeyError(instance.record_id)
        return CudaPreparedInstance(Replayer(recording, instance.record_id, device=device,
                                             verification=instance.verification_settings(),
                                             reset_decision=reset_decision,
                                             measurement=instance.measurement_settings()))

    def compiler(self) -> CompileFunction | None:
        try:
            import mneme.replay.compile  # noqa: F401  (only whether it is there)
        except ImportError:
            return None
        return compile_in_pool
