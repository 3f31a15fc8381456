"""Test doubles for the tuner's plumbing: a recorded kernel and a deterministic executor.

The executor's times depend on the configuration (so samplers have something
to find) and some configurations fail the ways real ones do: a block shape
that cannot launch, a pipeline/codegen pair that does not compile, a fast
configuration that computes the wrong answer, a faulting one. Hardware
counters asked for come from :func:`model_counters`, whose DRAM traffic is
least at 512 threads per block (the time is least at 128).
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import threading
import time
from types import SimpleNamespace

import pytest

from mneme.model.experiment import Dim3, ExperimentConfiguration, ExperimentResult
from mneme.model.verification import VerificationSettings
from tuner.recording import KernelIdentity

PASS_FACTOR = {"default<O1>": 1.10, "default<O2>": 1.02, "default<O3>": 1.0, "default<Os>": 1.05, "default<Oz>": 1.08}


def vecadd_kernel(grid=(40000, 1, 1), block=(256, 1, 1), shared_mem=0):
    return SimpleNamespace(grid_dim=Dim3(*grid), block_dim=Dim3(*block), shared_mem=shared_mem,
                           name="vecAdd", static_hash="15941914485064662553")


def model_time(config: ExperimentConfiguration) -> int:
    """A smooth synthetic cost: best near 128 threads per block, O3 and codegen 3."""
    threads = config.block.count
    shape = 1.0 + 0.15 * abs(math.log2(threads / 128.0))
    codegen = 1.0 + 0.04 * (3 - config.codegen_opt)
    return int(80_000 * shape * PASS_FACTOR.get(config.passes, 1.0) * codegen)


def model_counters(config: ExperimentConfiguration, names) -> dict[str, float]:
    """Synthetic hardware counters: DRAM bytes least at 512 threads per block, occupancy best at 256; any other
    name counts its own letters."""
    threads = config.block.count
    known = {"dram_bytes": 3 * 4 * 10_240_000 * (1.0 + 0.1 * abs(math.log2(threads / 512.0))),
             "achieved_occupancy": 90.0 - 10.0 * abs(math.log2(threads / 256.0))}
    return {name: known.get(name, float(len(name))) for name in names}


class FakeExecutor:
    """Deterministic stand-in for AsyncReplayExecutor (tests only)."""

    INVALID_LAUNCH_X = 96       # cudaErrorInvalidConfiguration, say
    UNVERIFIED_X = 320          # fast but wrong: must never be the best
    CRASH_X = 192               # illegal address

    def __init__(self, iterations=5, warmup=2, workers=2, interrupt_after=None, raise_on=None, delay=0.0,
                 metrics=(), metrics_error=None):
        self.iterations = iterations
        self.warmup = warmup
        self.pool = cf.ThreadPoolExecutor(max_workers=workers)
        self.submitted: list[ExperimentConfiguration] = []
        self.interrupt_after = interrupt_after
        self.raise_on = raise_on or (lambda config: False)
        self.shut = False
        self.evaluated = 0
        self.delay = delay
        self.metrics = tuple(metrics)  # hardware counters every replay reports (model_counters)
        self.metrics_error = metrics_error or (lambda config: "")  # config -> why its counters could not be had
        self._lock = threading.Lock()

    def _run(self, config: ExperimentConfiguration) -> ExperimentResult:
        time.sleep(self.delay)
        if self.raise_on(config):
            raise ConnectionError("replay server localhost:1 went away")
        x = config.block.x
        if x == self.INVALID_LAUNCH_X:
            return ExperimentResult.failure("invalid_launch", "CUDA_ERROR_INVALID_VALUE: too many resources")
        if config.passes == "default<Oz>" and config.codegen_opt == 1:
            return ExperimentResult.failure("compile_error", "ptxas fatal: synthetic compile error")
        if x == self.CRASH_X:
            return ExperimentResult.failure("runtime_error", "CUDA_ERROR_ILLEGAL_ADDRESS", executed=True)
        t = model_time(config)
        times = [t + 500 * i for i in range(self.warmup + self.iterations)]
        verified = x != self.UNVERIFIED_X
        if not verified:
            times = [1000] * len(times)
        why = self.metrics_error(config) if self.metrics else ""
        return ExperimentResult(
            exec_time=times, verified=verified, executed=True, warmup=self.warmup,
            status="verified" if verified else "failed_verification",
            error="" if verified else "3 bytes differ from the epilogue",
            reg_usage=16 + 2 * config.codegen_opt, obj_size=4000 + config.block.x, gpu_id=0,
            metrics={} if why else model_counters(config, self.metrics), metrics_error=why,
        )

    def submit(self, config):
        with self._lock:
            if self.interrupt_after is not None and len(self.submitted) >= self.interrupt_after:
                raise KeyboardInterrupt
            self.submitted.append(config)
        return self.pool.submit(self._run, config)

    def evaluate(self, config):
        self.evaluated += 1
        return self._run(config)

    def shutdown(self):
        self.shut = True
        self.pool.shutdown(wait=True)


class NondeterministicExecutor(FakeExecutor):
    """A reduction whose baseline needed a derived bound: trials of some shapes differ within it."""

    WITHIN = {"policy": "f32:ulp:12", "source": "auto", "exact": False, "worst": {"max_ulp": 2},
              "derived": {"derived": True, "runs": 8, "safety_factor": 4.0}}

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.verifications: list[VerificationSettings] = []  # what set_verification was given, in order

    def set_verification(self, verification):
        self.verifications.append(verification)

    def _run(self, config):
        result = super()._run(config)
        if result.verified and config.block.x != 128:
            result.verified_within = {"acc": dict(self.WITHIN, exact=config.block.x == 256)}
            if config.block.x == 256:
                result.nondeterminism = [{"region": "acc", "classification": "nondeterministic", "runs": 8}]
        return result


class EnergyExecutor(FakeExecutor):
    """Replays that measure energy, as servers asked for an energy window do: joules per launch = a power that
    grows with the threads per block x the launch time, so the fastest configuration is not the most frugal
    (a Pareto front of several points). ``throttled_x``: configurations of that block width were measured
    while the GPU throttled (``conditions``)."""

    UNAVAILABLE = "NVML did not initialize: NVML Shared Library Not Found (NVML error 12)"

    def __init__(self, measure_energy=True, throttled_x=None, **kwargs):
        super().__init__(**kwargs)
        self.measure_energy, self.throttled_x = measure_energy, throttled_x

    @staticmethod
    def power_w(config: ExperimentConfiguration) -> float:
        return 150.0 + 0.5 * config.block.count

    def _run(self, config):
        result = super()._run(config)
        if not result.verified:
            return result
        throttled = config.block.x == self.throttled_x
        reading = {"sm_clock_mhz": 1500 if throttled else 1980, "mem_clock_mhz": 2619, "temperature_c": 60,
                   "power_w": 300.0, "clock_event_reasons": ["sw_power_cap"] if throttled else [], "age_s": 0.001}
        result.conditions = {"before": reading, "throttled": throttled,
                             "throttle_reasons": ["sw_power_cap"] if throttled else []}
        if not self.measure_energy:
            result.conditions = {"unavailable": self.UNAVAILABLE}
            return result
        power = self.power_w(config)
        result.energy_j, result.power_w = power * result.measured_times[0] * 1e-9, power
        result.conditions["energy"] = {"window_s": 0.1, "launches": 1000.0, "counter_steps": 5, "batches": 5,
                                       "launches_run": 1200}
        return result


@pytest.fixture
def kernel():
    return vecadd_kernel()


@pytest.fixture
def loader(kernel):
    def load(record_database, record_id):
        return kernel, KernelIdentity("vecAdd", "15941914485064662553", str(record_id))

    return load


CUSTOM_SPACE = """
from mneme.model.experiment import ExperimentConfiguration
from tuner.space.search_space import CategoricalParam, IntRangeParam, SearchSpace


class BlockSpace(SearchSpace):
    def __init__(self, kernel, step=32, high=512, passes=("default<O3>", "default<Oz>")):
        self.kernel = kernel
        self.dims = {
            "block_dim_x": IntRangeParam("block_dim_x", low=step, high=high, step=step),
            "passes": CategoricalParam("passes", list(passes)),
        }

    def dimensions(self):
        return self.dims

    def derived(self, params):
        total = self.kernel.grid_dim.x * self.kernel.block_dim.x
        x = params["block_dim_x"]
        return ExperimentConfiguration.from_dict(
            {"grid": {"x": -(-total // x)}, "block": {"x": x}, "passes": params["passes"], "codegen_opt": 1})

    def baseline(self):
        return ExperimentConfiguration.from_dict(
            {"grid": {"x": self.kernel.grid_dim.x}, "block": {"x": self.kernel.block_dim.x}})
"""


@pytest.fixture
def cli_doubles(monkeypatch, kernel):
    """``mneme tune`` through the command line with the test doubles: every executor the run makes is a
    :class:`FakeExecutor` (appended to the returned list, so a test sees whether one was made) and the
    recording is :func:`vecadd_kernel`'s."""
    import tuner.run

    made: list[FakeExecutor] = []

    def make_executor(options, results_dir, compile_ahead):
        made.append(FakeExecutor())
        return made[-1]

    make_executor.dials_servers = True  # it stands in for the real one, which replays on --servers
    monkeypatch.setattr(tuner.run, "default_executor", make_executor)
    monkeypatch.setattr(tuner.run, "load_instance",
                        lambda db, rid: (kernel, KernelIdentity("vecAdd", "15941914485064662553", rid or "163")))
    return made


@pytest.fixture
def space_module(tmp_path):
    path = tmp_path / "block_space.py"
    path.write_text(CUSTOM_SPACE)
    return f"{path}:BlockSpace"
