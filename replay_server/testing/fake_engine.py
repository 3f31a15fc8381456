"""A test engine for the server's plumbing: real processes, no GPU.

What a replay does is chosen by the configuration's ``passes``:
  "crash"      the worker process dies (SIGSEGV), as when a driver fault kills it
  "hang"       the replay never returns (the watchdog must act)
  "slow:S"     sleeps S seconds, then verifies
  "fault"      a failed result and an unusable context (healthy False), like a trap
  "raise"      the engine raises (an engine bug: internal_error, worker keeps serving)
  "compile-crash"  the compile pool's process dies; the replay itself verifies
  "compile:S"  its compile takes S seconds; the replay verifies
  "compile-error"  its compile fails (a compiler error); the replay verifies
  anything     verified; exec_time = block.x ns per launch
What preparing does (``get_ready``, the one-time device work) is chosen by the record id:
  "ready-hang"   never returns (the watchdog must act)
  "ready-fault"  cannot replay: an unusable context (healthy False), with the reason
  anything       ready; appends "<record_id> <pid>" to ``log_dir``/ready.log
An instance whose measurement settings ask for energy (``InstanceKey.measurement``) reports
``energy_j`` = ``FAKE_POWER_W`` x its launch time and ``power_w`` = ``FAKE_POWER_W``.
Every instance a worker opens appends its verification settings (``InstanceKey.verification``,
``VerificationSettings.to_dict()``) as a JSON line to ``log_dir``/instances.log.
Opening the record id "taken-addresses" finds its recorded heap addresses taken: its replays
report ``relocated`` with the reason, and with ``relocate=False`` opening it fails as the real
engine's does (RelocationRefusedError).
Opening an instance (restoring it on a worker) appends "<record_id> <pid>" to opens.log.
Hardware counters asked for (``metrics``) come back as :func:`fake_metric_value` of each name and the
configuration; the record id "no-counters" answers them with a ``metrics_error``, as a host that
restricts profiling to administrators does.
Every replay also takes ``replay_seconds`` (a stand-in for the GPU's work) and
every compile ``compile_seconds``. Every replay appends "<passes> <block.x> <pid>"
to ``log_dir``/runs.log and every compile "<passes> <pid>" to compiles.log, so
tests can tell what ran and where.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from mneme._internal.startup_trace import mark
from mneme.errors import RelocationRefusedError
from mneme.model.experiment import ExperimentResult
from mneme.model.verification import ResetDecision

FAKE_POWER_W = 250.0
TAKEN_REASON = "reserving 0x200000000000-0x200000200000 (2 MiB) failed: simulated"
NO_COUNTERS_ERROR = ("hardware counters cannot be collected: the NVIDIA driver lets only administrators read GPU "
                     "performance counters (CUPTI_ERROR_INSUFFICIENT_PRIVILEGES) (simulated)")


def fake_metric_value(name: str, config) -> float:
    """What the test engine reports for a hardware counter: 1000 x the block's x extent, plus the name's
    length (different metrics, different values; a larger block, a larger value)."""
    return float(1000 * config.block.x + len(name))


@dataclass
class FakePrepared:
    log_dir: str
    record_id: str
    replay_seconds: float = 0.0
    device_bytes: int = 1 << 20
    healthy: bool = True
    reset_decision: ResetDecision | None = None  # as a proof elsewhere decided it (no proof here then)
    kernel_ns: int | None = 1000
    energy: bool = False  # the measurement settings ask for an energy window

    def fallback(self):
        """``proof-hang``: the proof's second launch does not finish (a kernel that is not idempotent)."""
        if self.record_id == "proof-hang" and not self.healthy:
            return ResetDecision(True, "the kernel is not idempotent: a second launch without a reset did not "
                                       "finish (simulated)")
        return None

    def _proof_loses_the_context(self) -> bool:
        return self.record_id == "proof-hang" and self.reset_decision is None

    def get_ready(self):
        if self._proof_loses_the_context():
            self.healthy = False
            return "the recorded baseline, launched to prove the kernel idempotent, did not finish (simulated)"
        if self.record_id == "ready-hang":
            time.sleep(3600)
        if self.record_id == "ready-fault":
            self.healthy = False
            return "the recorded baseline faulted (simulated): CUDA_ERROR_ILLEGAL_ADDRESS"
        with open(Path(self.log_dir) / "ready.log", "a") as log:
            log.write(f"{self.record_id} {os.getpid()}\n")
        return ""

    def run(self, config, iterations, warmup, compiled=None, metrics=()):
        if self._proof_loses_the_context():  # the first run proves, as a worker not prepared first does
            self.healthy = False
            return ExperimentResult.failure("timeout", "the recorded baseline, launched to prove the kernel "
                                            "idempotent, did not finish (simulated)", warmup=warmup)
        with open(Path(self.log_dir) / "runs.log", "a") as log:
            log.write(f"{config.passes} {config.block.x} {os.getpid()}\n")
        if self.replay_seconds:
            time.sleep(self.replay_seconds)
        mode = config.passes
        if mode == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if mode == "hang":
            time.sleep(3600)
        if mode.startswith("slow:"):
            time.sleep(float(mode.split(":", 1)[1]))
        if mode == "fault":
            self.healthy = False
            return ExperimentResult.failure("runtime_error", "CUDA_ERROR_ILLEGAL_ADDRESS (simulated)", warmup=warmup)
        if mode == "raise":
            raise RuntimeError("simulated engine bug")
        n = warmup + iterations
        relocated = self.record_id == "taken-addresses"
        resets = self.reset_decision is not None and self.reset_decision.each_launch
        energy = {"energy_j": FAKE_POWER_W * config.block.x * 1e-9, "power_w": FAKE_POWER_W} if self.energy else {}
        counters, counters_error = self._metrics(config, metrics)
        return ExperimentResult(
            exec_time=[config.block.x] * n, verified=True, executed=True, status="verified", warmup=warmup,
            gpu_id=0, obj_size=len(compiled) if compiled else -1,
            relocated=relocated, relocation_reason=TAKEN_REASON if relocated else "",
            reset_each_launch=resets, reset_reason=self.reset_decision.reason if resets else "",
            metrics=counters, metrics_error=counters_error, **energy,
        )

    def _metrics(self, config, metrics):
        if not metrics:
            return {}, ""
        if self.record_id == "no-counters":
            return {}, NO_COUNTERS_ERROR
        return {name: fake_metric_value(name, config) for name in metrics}, ""

    def close(self):
        pass


def fake_compile(instance, config, arch, log_dir="", seconds=0.01):
    passes = config["passes"]
    if log_dir:
        with open(Path(log_dir) / "compiles.log", "a") as log:
            log.write(f"{passes} {os.getpid()}\n")
    if passes == "compile-crash":  # the compiler process dies (a ptxas crash, an OOM kill)
        os._exit(1)
    if passes == "compile-error":
        raise RuntimeError("simulated compiler error: ptxas fatal")
    cost = float(passes.split(":", 1)[1]) if passes.startswith("compile:") else seconds
    time.sleep(cost)
    mark("compile", "compiled", seconds=cost)  # as the real compile does (bench/tune_startup.py sums them)
    return f"code:{passes}:{arch}".encode()


@dataclass(frozen=True)
class FakeEngineSpec:
    log_dir: str
    fail_starts: int = 0  # the first N self-tests fail
    name: str = "fake"
    with_compiler: bool = True
    replay_seconds: float = 0.0
    compile_seconds: float = 0.01

    def warm_up(self):
        pass

    def self_test(self, device):
        counter = Path(self.log_dir) / "starts"
        # Workers of several servers count here at once, and tests read the count while they do:
        # increment under a lock, and replace the file whole so a reader never sees it empty.
        with open(Path(self.log_dir) / "starts.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            starts = int(counter.read_text()) if counter.exists() else 0
            partial = counter.with_suffix(f".{os.getpid()}")
            partial.write_text(str(starts + 1))
            os.replace(partial, counter)
        if starts < self.fail_starts:
            raise RuntimeError(f"simulated self-test failure {starts + 1}")
        return {"arch": "sm_test", "name": "fake GPU"}

    def open(self, instance, device, reset_decision=None):
        if instance.record_id == "missing":
            raise KeyError(instance.record_id)
        verification = instance.verification_settings()
        with open(Path(self.log_dir) / "instances.log", "a") as log:
            log.write(json.dumps(verification.to_dict()) + "\n")
        if instance.record_id == "taken-addresses" and verification.relocate is False:
            raise RelocationRefusedError(f"the recorded heap cannot be placed at its recorded addresses ({TAKEN_REASON})")
        with open(Path(self.log_dir) / "opens.log", "a") as log:
            log.write(f"{instance.record_id} {os.getpid()}\n")
        return FakePrepared(self.log_dir, instance.record_id, self.replay_seconds, reset_decision=reset_decision,
                            energy=instance.measurement_settings().energy)

    def compiler(self):
        if not self.with_compiler:
            return None
        return functools.partial(fake_compile, log_dir=self.log_dir, seconds=self.compile_seconds)


def spec_from_env() -> FakeEngineSpec:
    """Factory for servers started as subprocesses: ``--engine replay_server.testing.fake_engine:spec_from_env``."""
    return FakeEngineSpec(**json.loads(os.environ["MNEME_FAKE_ENGINE"]))
