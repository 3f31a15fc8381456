"""The compile pool with the real compile function (mneme.replay.compile, ptxas: CPU only)."""

from __future__ import annotations

import shutil
from concurrent.futures import CancelledError
from pathlib import Path

import pytest

from mneme.model.experiment import ExperimentConfiguration
from mneme.testing.faulty_recording import write_faulty_recording
from replay_server.server.compile_cache import CompileCache, compile_key
from replay_server.server.cuda_engine import CudaEngineSpec
from replay_server.server.engine import InstanceKey
from replay_server.server.metrics import ServerMetrics


def test_real_compiles_run_in_the_pool_and_are_cached(tmp_path, monkeypatch):
    if shutil.which("ptxas") is None and not Path("/usr/local/cuda/bin/ptxas").exists():
        pytest.skip("ptxas (CUDA toolkit) is not installed")
    monkeypatch.setenv("MNEME_CACHE_DIR", str(tmp_path / "cache"))
    path, record_id = write_faulty_recording(tmp_path / "store", n=1024)
    instance = InstanceKey(str(tmp_path / "store"), path.name, record_id)
    compiler = CudaEngineSpec().compiler()
    assert compiler is not None
    metrics = ServerMetrics(0, "cuda")
    cache = CompileCache(compiler, processes=1, metrics=metrics)
    try:
        o2 = ExperimentConfiguration.from_dict({"block": {"x": 256}, "codegen_opt": 2})
        code = cache.request(instance, o2, "sm_90").result(timeout=120)
        assert code.tier == "ptx" and code.image[:4] == b"\x7fELF" and code.arch == "sm_90"
        reshaped = o2.replace(block={"x": 128, "y": 1, "z": 1})  # the launch shape is not in the code
        assert compile_key(instance, reshaped, "sm_90") == compile_key(instance, o2, "sm_90")
        assert cache.request(instance, reshaped, "sm_90").result(timeout=5) is code
        assert (cache.hits, cache.misses) == (1, 1)
        specialized = o2.replace(specialize_dims=True)
        assert compile_key(instance, specialized, "sm_90") != compile_key(instance, o2, "sm_90")
        baseline = cache.request(instance, ExperimentConfiguration.from_dict({"block": {"x": 256}}), "sm_90")
        assert baseline.result(timeout=120).tier == "recorded"
        bad = cache.request(instance, o2.replace(passes="default<O1>"), "sm_90")  # needs bitcode: not recorded
        with pytest.raises(Exception, match="bitcode"):
            bad.result(timeout=120)
        assert len(cache) == 2, "failed compiles are not cached"
    finally:
        cache.close()


def _compile_after(instance, config, arch):
    """A stand-in compile function: sleeps ``config['sleep']`` seconds (picklable for the spawned processes)."""
    import time

    time.sleep(config.get("sleep", 0.0))
    return f"code:{arch}"


def test_a_compile_goes_to_the_first_free_process_not_behind_a_busy_one(tmp_path):
    cache = CompileCache(_compile_after, processes=2, metrics=ServerMetrics(0, "test"))
    instance = InstanceKey(str(tmp_path), "db.json", "1")
    try:
        # Both processes get work (a slow warm-up in process 0, a short one in 1); then a compile is asked for.
        slow = cache._submit(0, _compile_after, instance, {"sleep": 10.0}, "sm_90")
        quick = cache._submit(1, _compile_after, instance, {"sleep": 0.0}, "sm_90")
        code = cache.request(instance, ExperimentConfiguration(), "sm_90")
        # It runs in the first process to be free (1), not queued behind process 0's slow work.
        assert code.result(timeout=7) == "code:sm_90"
        assert quick.done() and not slow.done()
    finally:
        cache.close()


def test_warm_reads_an_instance_once_per_process_and_caches_the_recorded_launch(tmp_path):
    cache = CompileCache(_compile_after, processes=2, metrics=ServerMetrics(0, "test"))
    instance = InstanceKey(str(tmp_path), "db.json", "1")
    try:
        first = cache.warm(instance, "sm_90")
        assert len(first) == 2 and all(w.result(timeout=60)[0] == "code:sm_90" for w in first)
        assert cache.warm(instance, "sm_90") == []  # a second Prepare of the instance: nothing in front of a sweep
        assert len(cache.warm(InstanceKey(str(tmp_path), "db.json", "2"), "sm_90")) == 2
        baseline = ExperimentConfiguration.from_dict({"block": {"x": 256}})  # the launch shape is not in the code
        assert cache.request(instance, baseline, "sm_90").result(timeout=5) == "code:sm_90"
        assert (cache.hits, cache.misses) == (1, 0)
    finally:
        cache.close()


def _compile_stamped(instance, config, arch):
    """A stand-in compile function: the configuration's codegen_opt and when its compile ran."""
    import time

    time.sleep(0.05)
    return config["codegen_opt"], time.monotonic()


def test_compiles_asked_ahead_yield_to_replays_and_one_a_replay_needs_moves_up(tmp_path):
    cache = CompileCache(_compile_stamped, processes=1, metrics=ServerMetrics(0, "test"))
    instance = InstanceKey(str(tmp_path), "db.json", "1")
    opt = [ExperimentConfiguration.from_dict({"codegen_opt": level}) for level in range(5)]
    try:
        busy = cache._submit(0, _compile_after, instance, {"sleep": 1.0}, "sm_90")  # the only process is busy
        ahead = [cache.request_counted(instance, opt[level], "sm_90", ahead=True)[0] for level in (0, 1, 2)]
        replay = cache.request(instance, opt[4], "sm_90")  # a replay's compile: before every one asked ahead
        promoted, hit = cache.request_counted(instance, opt[2], "sm_90")  # a replay needs one asked ahead
        assert hit and promoted is ahead[2]
        busy.result(timeout=60)
        done = [f.result(timeout=60) for f in (*ahead, replay)]
        assert [level for level, _ in sorted(done, key=lambda d: d[1])] == [4, 2, 0, 1]
        again, hit = cache.request_counted(instance, opt[0], "sm_90", ahead=True)  # asked ahead twice: one compile
        assert hit and again.result(timeout=1) == done[0]
    finally:
        cache.close()


def test_closing_the_pool_fails_compiles_still_waiting_instead_of_leaving_them_hanging(tmp_path):
    cache = CompileCache(_compile_after, processes=1, metrics=ServerMetrics(0, "test"))
    instance = InstanceKey(str(tmp_path), "db.json", "1")
    busy = cache._submit(0, _compile_after, instance, {"sleep": 3.0}, "sm_90")
    waiting = cache.request(instance, ExperimentConfiguration(), "sm_90")  # no idle process: it waits in the queue
    ahead = cache.request_counted(instance, ExperimentConfiguration.from_dict({"codegen_opt": 2}), "sm_90",
                                  ahead=True)[0]  # asked for ahead: in the other queue
    cache.close()
    for future in (waiting, ahead):
        with pytest.raises(CancelledError):
            future.result(timeout=10)
    busy.result(timeout=30)
