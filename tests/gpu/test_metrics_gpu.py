"""Hardware counters of replayed launches on a GPU (CUPTI's range profiler).

Where the host does not let this process read the counters (the driver restricts them to
administrators, a virtualized or MIG GPU, counters held by DCGM or another profiler) every test checks
that the error names the cause, then skips with it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import mneme.testing.synthetic_recordings as synth
from mneme.recording.execution import RecordedExecution
from mneme.replay.metrics import CURATED, GROUPS
from mneme.testing.gpu import child_env

pytestmark = pytest.mark.gpu
#: Large enough that the L2 (50 MB on the H100) holds a small part of the traffic: the output lines still
#: dirty in the L2 when the launch ends are written back after the profiled range.
N_LARGE = 1 << 26
#: What a refusal's message names (mneme.replay.metrics.CAUSES, explain()).
REFUSALS = ("hardware counters cannot be collected", "hardware counters are not available here")


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MNEME_CACHE_DIR", str(tmp_path / "cache"))
    import mneme.replay.compile as compile_mod

    monkeypatch.setattr(compile_mod, "_default_cache", None)


def _skip_when_refused(result) -> None:
    """A host that refuses the profiler: the error names the cause; then the test is skipped with it."""
    if not result.metrics_error:
        return
    assert result.metrics_error.startswith(REFUSALS), result.metrics_error
    assert "\n" not in result.metrics_error
    pytest.skip(f"this host does not let the profiler run: {result.metrics_error}")


@pytest.fixture(scope="module")
def large_vecadd(tmp_path_factory) -> Path:
    return synth.vecadd(tmp_path_factory.mktemp("vecadd-large"), n=N_LARGE, block=256)


@pytest.fixture(scope="module")
def small_vecadd(tmp_path_factory) -> Path:
    return synth.vecadd(tmp_path_factory.mktemp("vecadd"), n=1 << 20, block=256)


def _replayer(path: Path):
    from mneme.replay import Replayer

    rec = RecordedExecution.from_json(str(path))
    return Replayer(rec, rec.single_instance().record_id)


def test_dram_bytes_of_a_vector_add_are_three_arrays(large_vecadd):
    with _replayer(large_vecadd) as replayer:
        result = replayer.run(replayer.baseline(), iterations=3, warmup=1,
                              metrics=("dram_bytes", "dram_read_bytes", "dram_write_bytes"))
        profile = replayer.last_profile
    assert result.status == "verified", result.error
    _skip_when_refused(result)
    expected = 3 * N_LARGE * 4  # a and b read, c written, once each
    dram = result.metrics["dram_bytes"]
    assert abs(dram - expected) <= 0.05 * expected, (result.metrics, profile)
    assert abs(result.metrics["dram_read_bytes"] - 2 * N_LARGE * 4) <= 0.05 * 2 * N_LARGE * 4, result.metrics
    assert result.metrics["dram_write_bytes"] <= 1.05 * N_LARGE * 4, result.metrics
    assert profile["chip"] and profile["passes"] >= 1
    assert profile["raw"]["dram_bytes"] == "dram__bytes.sum"


def test_the_counters_are_the_same_run_to_run(large_vecadd):
    with _replayer(large_vecadd) as replayer:
        first = replayer.run(replayer.baseline(), iterations=1, warmup=0, metrics=("dram_bytes",))
        _skip_when_refused(first)
        second = replayer.run(replayer.baseline(), iterations=1, warmup=0, metrics=("dram_bytes",))
    a, b = first.metrics["dram_bytes"], second.metrics["dram_bytes"]
    assert abs(a - b) <= 0.01 * a, (a, b)  # memory reset and L2 flushed before each pass


def test_every_curated_metric_gives_a_number(small_vecadd):
    names = [n for n in CURATED if not n.startswith("stall_")] + list(GROUPS)
    with _replayer(small_vecadd) as replayer:
        result = replayer.run(replayer.baseline(), iterations=3, warmup=1, metrics=names)
        profile = replayer.last_profile
    assert result.status == "verified", result.error
    _skip_when_refused(result)
    metrics = result.metrics
    expected = {n for n in CURATED} - set(profile["missing"])
    assert set(metrics) == expected, (set(metrics) ^ expected, profile)
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["dram_bytes"] > 0 and metrics["instructions"] > 0 and metrics["duration_ns"] > 0
    for pct in ("achieved_occupancy", "sm_throughput", "memory_throughput", "l2_hit_rate", "dram_throughput"):
        assert 0 <= metrics[pct] <= 105, (pct, metrics[pct])  # percent (of peak): a little above 100 happens
    assert 0 < metrics["achieved_occupancy"]
    assert profile["passes"] > 1  # this many metrics do not fit one pass


def test_a_configuration_other_than_the_baseline_is_profiled_as_launched(small_vecadd):
    n = 1 << 20
    with _replayer(small_vecadd) as replayer:
        config = replayer.baseline().replace(block={"x": 512, "y": 1, "z": 1}, grid={"x": n // 512, "y": 1, "z": 1})
        result = replayer.run(config, iterations=2, warmup=0, metrics=("instructions",))
        _skip_when_refused(result)
        baseline = replayer.run(replayer.baseline(), iterations=2, warmup=0, metrics=("instructions",))
    assert result.status == "verified" and result.metrics["instructions"] > 0
    # the same work in half as many blocks: about the same warp instructions (within the per-block overhead)
    assert abs(result.metrics["instructions"] - baseline.metrics["instructions"]) <= 0.1 * baseline.metrics["instructions"]


def test_an_unknown_metric_is_a_clear_error(small_vecadd):
    with _replayer(small_vecadd) as replayer:
        result = replayer.run(replayer.baseline(), metrics=("dram__byts.sum",))
        profiled = replayer.run(replayer.baseline(), metrics=("dram_bytes",))
    assert result.verified and result.metrics == {}
    if profiled.metrics_error:  # the profiler cannot run here: the name cannot be checked either
        assert result.metrics_error.startswith(REFUSALS), result.metrics_error
        _skip_when_refused(profiled)
    assert "has no such metric; close names:" in result.metrics_error and "dram__bytes" in result.metrics_error


def test_mneme_replay_metrics_on_the_command_line(small_vecadd, tmp_path):
    def replay(*flags):
        return subprocess.run([sys.executable, "-m", "mneme", "replay", "-rdb", str(small_vecadd), "--json", *flags],
                              capture_output=True, text=True, env=child_env(MNEME_CACHE_DIR=str(tmp_path / "c")),
                              timeout=600)

    done = replay("--metrics", "dram_bytes,achieved_occupancy")
    if done.returncode == 2 and (REFUSALS[0] in done.stderr or REFUSALS[1] in done.stderr):
        assert "CUPTI_ERROR" in done.stderr or "libcupti" in done.stderr, done.stderr
        pytest.skip(f"this host does not let the profiler run: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)["Result"]
    assert set(result["metrics"]) == {"dram_bytes", "achieved_occupancy"} and result["metrics_error"] == ""
    assert "profiler pass(es) on the" in done.stderr
    unknown = replay("--metrics", "dram__byts.sum")
    assert unknown.returncode == 2 and "no such metric; close names:" in unknown.stderr, unknown.stderr
    listed = subprocess.run([sys.executable, "-m", "mneme", "replay", "--list-metrics"], capture_output=True,
                            text=True, env=child_env(), timeout=120)
    assert listed.returncode == 0 and "raw CUPTI metric on the " in listed.stdout, listed.stdout


def test_replay_servers_collect_the_counters_a_request_names(small_vecadd, tmp_path):
    from replay_server.client.executor import AsyncReplayExecutor

    rec = RecordedExecution.from_json(str(small_vecadd))
    instance = rec.single_instance()
    with AsyncReplayExecutor(record_db=str(small_vecadd), record_id=instance.record_id, iterations=3,
                             num_workers=1, metrics=["dram_bytes", "l2_hit_rate"]) as executor:
        from mneme.model.experiment import ExperimentConfiguration

        config = ExperimentConfiguration(grid=instance.grid_dim, block=instance.block_dim)
        result = executor.evaluate(config)
    assert result.verified, result.error
    _skip_when_refused(result)
    assert set(result.metrics) == {"dram_bytes", "l2_hit_rate"} and result.metrics["dram_bytes"] > 0
