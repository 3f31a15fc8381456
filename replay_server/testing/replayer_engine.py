"""The real replay stack without a GPU: ``CudaEngineSpec`` (``mneme.replay.Replayer``, the real compile
function) over the fake native engine (``mneme.testing.fake_native_engine`` with a ``FakeKernel``).

What a server with this engine measures is everything but the GPU: the supervisor, the pipes, the
worker's Python (``Replayer.run``: checks, the module cache, the judge, the result), the compile pool
(real compiles of the recorded PTX: nvPTXCompiler where the build has it, else ``ptxas``), result
encoding and gRPC. A launch costs ``launch_ns`` of the kernel's time as the fake reports it and, with
``sleep``, that long of wall time with the interpreter lock released (the real engine releases it
around its launch loop), so the worker waits as it would for a GPU.

    mneme serve --engine replay_server.testing.replayer_engine:spec_from_env \\
        # environment: MNEME_REPLAYER_ENGINE='{"launch_ns": 47900, "sleep": true}'

``bench/server_throughput.py --engine test`` runs its rows on it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from replay_server.server.cuda_engine import CudaEngineSpec, compile_in_pool
from replay_server.server.engine import CompileFunction, InstanceKey

ENVIRONMENT = "MNEME_REPLAYER_ENGINE"
_installed: dict[str, Any] = {}
_install_lock = threading.Lock()  # a worker's warm-up thread and its self-test may both install


def install(launch_ns: int = 1000, sleep: bool = False) -> None:
    """Put the fake native engine under ``mneme.replay`` in this process (once): modules load and
    launches return what the native engine returns, each launch ``launch_ns`` long.

    Args:
        launch_ns: the kernel's time per launch the fake reports.
        sleep: also spend that time (per engine call: launches x ``launch_ns``), without the GIL.
    """
    with _install_lock:
        if not _installed:
            _install(launch_ns, sleep)


def _install(launch_ns: int, sleep: bool) -> None:
    from mneme.replay import engine as eng
    from mneme.replay import placement
    from mneme.replay.placement import ProcessReservations
    from mneme.testing import fake_native_engine as fake

    space = fake.AddressSpace(kernel=fake.FakeKernel(time_ns=int(launch_ns)))
    if sleep:
        _sleep_in_runs(fake, float(launch_ns))
    _keep_no_runs(space.kernel)
    eng._engine = fake.native_module(space)
    placement._process = ProcessReservations()
    _installed["space"] = space


def _keep_no_runs(kernel: Any) -> None:
    """The fake kernel records every run's arguments (for tests); a long benchmark must not."""

    class Forgetful(list):
        def append(self, item: Any) -> None:
            pass

    kernel.runs = Forgetful()


def _sleep_in_runs(fake: Any, launch_ns: float) -> None:
    """Launches take the GPU's time: one GPU, one thing at a time. ``FakeFunction.run`` returns when its
    launches would have ended; ``FakeContext.start_batch`` returns at once, and its batch's ``wait``
    returns (and ``done`` turns true) when the GPU would be done with it, after what was enqueued before."""
    run, start_batch = fake.FakeFunction.run, getattr(fake.FakeContext, "start_batch", None)  # (an older mneme: none)
    gpu = {"free_at": 0.0}

    def occupy(launches: int) -> float:
        end = max(time.monotonic(), gpu["free_at"]) + launches * launch_ns / 1e9
        gpu["free_at"] = end
        return end

    def sleep_until(end: float) -> None:
        left = end - time.monotonic()
        if left > 0:
            time.sleep(left)

    def timed_run(self, grid, block, shared_mem, args, launches, *rest, **options):
        out = run(self, grid, block, shared_mem, args, launches, *rest, **options)
        if not gpu.get("batching"):  # (a batch's items: the batch takes their time)
            sleep_until(occupy(int(launches)))
        return out

    def timed_start_batch(self, items, *rest, **options):
        gpu["batching"] = True
        try:
            batch = start_batch(self, items, *rest, **options)
        finally:
            gpu["batching"] = False
        end = occupy(batch.launches)
        wait = batch.wait
        batch.done = lambda: time.monotonic() >= end
        batch.wait = lambda timeout_s=0.0: (sleep_until(end), wait(timeout_s))[1]
        return batch

    fake.FakeFunction.run = timed_run
    if start_batch is not None:
        fake.FakeContext.start_batch = timed_start_batch


def _compile(instance: InstanceKey, config: dict, arch: str) -> Any:
    return compile_in_pool(instance, config, arch)


@dataclass(frozen=True)
class ReplayerEngineSpec(CudaEngineSpec):
    """``CudaEngineSpec`` over the fake native engine (see the module's docstring)."""

    name: str = "replayer-on-fake"
    launch_ns: int = 1000
    sleep: bool = False
    arch: str = "sm_90"

    def warm_up(self) -> None:
        install(self.launch_ns, self.sleep)
        super().warm_up()

    def self_test(self, device: int) -> dict:
        install(self.launch_ns, self.sleep)
        return {"arch": self.arch, "name": "fake GPU (replayer on the fake native engine)", "total_memory": 8 << 30}

    def open(self, instance: InstanceKey, device: int, reset_decision: Any = None) -> Any:
        install(self.launch_ns, self.sleep)
        return super().open(instance, device, reset_decision)

    def compiler(self) -> CompileFunction | None:
        return _compile


def spec_from_env() -> ReplayerEngineSpec:
    """Factory for ``--engine replay_server.testing.replayer_engine:spec_from_env``: settings from
    ``$MNEME_REPLAYER_ENGINE`` (JSON: ``launch_ns``, ``sleep``, ``arch``).

    Returns:
        The engine spec.
    """
    return ReplayerEngineSpec(**json.loads(os.environ.get(ENVIRONMENT) or "{}"))
