"""GPU tests of what replays measure besides times: the GPU's conditions (NVML), the energy window, and
``mneme serve --lock-clocks``; and ``mneme tune --objective time,energy`` end to end.

They need nvidia-ml-py (``pynvml``) beside the driver; without it they skip, saying so.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import mneme.testing.synthetic_recordings as synth
from mneme._internal import nvml
from mneme.model.measurement import MeasurementSettings
from mneme.recording.execution import RecordedExecution
from mneme.testing.gpu import child_env

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MNEME_CACHE_DIR", str(tmp_path / "cache"))
    import mneme.replay.compile as compile_mod

    monkeypatch.setattr(compile_mod, "_default_cache", None)


@pytest.fixture(scope="module")
def gpu():
    reason = nvml.unavailable_reason()
    if reason:
        pytest.skip(f"NVML is not usable here: {reason}")
    return nvml.cuda_device(0)


@pytest.fixture(scope="module")
def vecadd_path(tmp_path_factory) -> Path:
    return synth.vecadd(tmp_path_factory.mktemp("vecadd"), n=1 << 22, block=256)


def _replay(path: Path, measurement: MeasurementSettings, iterations: int = 20):
    from mneme.replay import Replayer

    rec = RecordedExecution.from_json(str(path))
    with Replayer(rec, rec.single_instance().record_id, measurement=measurement) as replayer:
        return replayer.run(replayer.baseline(), iterations=iterations, warmup=3)


def _sane(reading: dict) -> None:
    assert 100 <= reading["sm_clock_mhz"] <= 4000, reading
    assert 100 <= reading["mem_clock_mhz"] <= 20000, reading
    assert 0 <= reading["temperature_c"] <= 120, reading
    assert 0 < reading["power_w"] < 2000, reading
    assert all(isinstance(r, str) for r in reading["clock_event_reasons"]), reading


def test_conditions_are_recorded_and_sane(gpu, vecadd_path):
    result = _replay(vecadd_path, MeasurementSettings(conditions_max_age_s=0))
    assert result.verified, result.error
    conditions = result.conditions
    assert "unavailable" not in conditions, conditions
    _sane(conditions["before"])
    _sane(conditions["after"])  # max age 0: read after the launches too
    assert 0 <= conditions["before"]["age_s"] < 1
    assert isinstance(conditions["throttled"], bool)
    assert conditions["throttled"] == bool(nvml.throttling(conditions["before"]["clock_event_reasons"]
                                                           + conditions["after"]["clock_event_reasons"]))


def test_energy_of_the_vector_add(gpu, vecadd_path):
    result = _replay(vecadd_path, MeasurementSettings(energy=True, energy_window_s=0.2))
    assert result.verified, result.error
    window = result.conditions["energy"]
    assert "error" not in window, window
    assert result.energy_j > 0 and result.power_w > 0, window
    limits = gpu.power_limits_w()
    if limits is not None:
        assert result.power_w <= limits[1] * 1.25, (result.power_w, limits)
    # joules / watts = seconds per launch in the window: about the kernel's time (plus launch gaps)
    per_launch_s = result.energy_j / result.power_w
    kernel_s = min(result.measured_times) / 1e9
    assert 0.5 * kernel_s <= per_launch_s <= 10 * kernel_s, (per_launch_s, kernel_s, window)
    assert window["window_s"] >= 0.05 and window["counter_steps"] >= 2 and window["launches"] > 0


def test_lock_clocks_max_locks_or_says_once_why_not(gpu, vecadd_path, tmp_path):
    from mneme.model.experiment import ExperimentConfiguration
    from replay_server.client.executor import AsyncReplayExecutor

    process = subprocess.Popen(
        [sys.executable, "-m", "replay_server", "--gpu", "0", "--port", "0", "--host", "127.0.0.1",
         "--store", str(vecadd_path.parent), "--lock-clocks", "max", "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=tmp_path)
    try:
        line = process.stdout.readline()
        assert "listening on" in line, line
        address = line.split("listening on ", 1)[1].split()[0]
        locked = "clocks locked at max" in line
        if locked:
            instance = RecordedExecution.from_json(str(vecadd_path)).single_instance()
            config = ExperimentConfiguration(grid=instance.grid_dim, block=instance.block_dim)
            with AsyncReplayExecutor(str(vecadd_path), instance.record_id, iterations=20,
                                     servers=[address]) as executor:
                result = executor.evaluate(config)
            assert result.verified, result.error
            max_sm, _ = gpu.max_clocks_mhz()
            reading = result.conditions["before"]
            # (one clock step of slack: NVML reports the clock it runs, in steps of ~15 MHz)
            assert abs(reading["sm_clock_mhz"] - max_sm) <= 30 or result.conditions["throttled"], (reading, max_sm)
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    said = [x for x in err.splitlines() if "--lock-clocks" in x]
    if locked:
        assert not [x for x in said if "failed" in x], err  # restored without an error
    else:
        assert len(said) == 1 and "the clocks are not locked" in said[0], err


def test_tune_time_and_energy_gives_a_pareto_front(gpu, vecadd_path, tmp_path):
    out = tmp_path / "run"
    rc = subprocess.run(
        [sys.executable, "-m", "mneme", "tune", "-rdb", str(vecadd_path), "--objective", "time,energy",
         "--sampler", "nsga2", "--trials", "8", "--seed", "0", "--space-preset", "launch", "--iterations", "10",
         "--energy-window", "0.1", "--results-dir", str(out), "--quiet"],
        env=child_env(), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert rc.returncode == 0, rc.stderr
    best = json.loads((out / "best.json").read_text())
    assert best["objectives"] == ["mean_time_ns", "energy_j_per_launch"]
    assert best["pareto_front"] and all(p["energy_j"] > 0 and p["power_w"] > 0 for p in best["pareto_front"])
    assert best["best"]["spread"]["ci_ns"] and isinstance(best["best"]["overlaps_baseline"], bool)
    baseline = json.loads((out / "baseline.json").read_text())
    assert baseline["result"]["energy_j"] > 0 and "before" in baseline["conditions"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["baseline_energy_j"] > 0 and summary["throttled_trials"] >= 0


def test_nvml_cost_bench_runs(gpu):
    bench = Path(__file__).resolve().parents[2] / "bench" / "nvml_cost.py"
    run = subprocess.run([sys.executable, str(bench), "--reps", "50", "--counter-seconds", "0.3"],
                         env=child_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "conditions()" in run.stdout and "energy counter" in run.stdout
