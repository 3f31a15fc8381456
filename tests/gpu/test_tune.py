"""GPU tests of `mneme tune`: the reference's two CLI examples on the committed vector-add recording.

Both run the real command (a subprocess of ``python -m mneme tune``) against
``tests/data/recordings/vecadd/`` with local replay servers, and check every
file of the results directory. A third runs the built-in space on a
synthetic recording, so the tuner is exercised on the GPU even where the
committed recording is missing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mneme.recording.execution import RecordedExecution
from mneme.testing.gpu import child_env  # noqa: E402
from mneme.testing.synthetic import write_vecadd_recording

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
RECORDING_DIR = REPO / "tests" / "data" / "recordings" / "vecadd"
EXAMPLE_SPACE = REPO / "examples" / "tuning_vecadd_exhaustive.py"
OUTPUTS = ("config.json", "search_space.json", "baseline.json", "trials.jsonl", "best.json", "summary.json",
           "logs/tune.log", "proteus_tuned_kernels.json")
STATUSES = {"verified", "invalid_launch", "invalid_config", "compile_error", "runtime_error",
            "failed_verification", "timeout", "internal_error"}


def committed_recording() -> tuple[str, str]:
    """(database path, instance id) of tests/data/recordings/vecadd/, found at test time."""
    if not RECORDING_DIR.is_dir():
        pytest.skip(f"{RECORDING_DIR.relative_to(REPO)} is not in this checkout (the recorder's vector-add recording)")
    rec = RecordedExecution.from_json(str(RECORDING_DIR))
    record_id = sorted(rec.instances)[0]
    return rec.path, record_id


def tune_env(cwd: Path) -> dict[str, str]:
    """The children import the same mneme (and tuner) as this process, with a private compile cache."""
    return child_env(MNEME_CACHE_DIR=str(cwd / "cache"))


def mneme_tune(*args: str, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "mneme", "tune", *args], cwd=cwd, env=tune_env(cwd),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"mneme tune failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def check_results(run: Path, expected_trials: int, record_id: str) -> list[dict]:
    for name in OUTPUTS:
        assert (run / name).is_file(), f"{name} missing from {run}"
    trials = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    assert len(trials) == expected_trials
    assert len({t["hash"] for t in trials}) == len(trials)
    for t in trials:
        assert t["status"] in STATUSES
        if t["status"] == "verified":
            assert t["metric"] > 0 and t["speedup"] > 0
            assert len(t["result"]["exec_time"]) == 7  # 2 warm-ups + 5 iterations
        else:
            assert t["error"] and t["metric"] is None
    verified = [t for t in trials if t["status"] == "verified"]
    assert verified, "no configuration verified"
    baseline = json.loads((run / "baseline.json").read_text())
    assert baseline["verified"] and baseline["metric"] > 0
    best = json.loads((run / "best.json").read_text())["best"]
    assert best["metric"] == min(t["metric"] for t in verified)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["trials"] == len(trials) and summary["verified"] == len(verified) and summary["finished"]
    # complete: every point of the space has a trial (an enumeration), not a sampler's budget used up
    assert summary["complete"] == (summary["stopped"] == "exhausted")
    export = json.loads((run / "proteus_tuned_kernels.json").read_text())
    assert export["kernels"][0]["record_id"] == record_id
    assert export["kernels"][0]["configuration"] == best["configuration"]
    assert (run / "logs" / "tune.log").stat().st_size > 0
    return trials


def common_flags(results: Path) -> list[str]:
    return ["--sampler", "exhaustive", "--iterations", "5", "--warmup", "2", "--workers", "1", "--metric", "mean",
            "--objective", "time", "--results-dir", str(results)]


def test_reference_custom_space_example(tmp_path):
    db, record_id = committed_recording()
    run = tmp_path / "mneme-tune-results" / "vecadd-exhaustive"
    mneme_tune("--record-database", db, "--record-id", record_id,
               "--space-module", f"{EXAMPLE_SPACE}:EntireSpace", *common_flags(run), cwd=tmp_path)
    trials = check_results(run, 80, record_id)
    # the recorded cubin and its recompiles verify; pipelines other than default<O3> need bitcode
    assert {t["params"]["block_dim_x"] for t in trials if t["status"] == "verified"} >= {64, 128, 256, 1024}


def test_reference_builtin_launch_preset_example(tmp_path):
    db, record_id = committed_recording()
    run = tmp_path / "mneme-tune-results" / "vecadd-builtin"
    mneme_tune("--record-database", db, "--record-id", record_id, "--space-preset", "launch",
               "--launch-dim", "x", "--launch-safety", "aggressive",
               "--passes", "default<O1>", "default<O2>", "default<O3>", "default<Os>", "default<Oz>",
               "--fixed-codegen-opt", "3", *common_flags(run), cwd=tmp_path)
    size = json.loads((run / "search_space.json").read_text())["size"]
    trials = check_results(run, size, record_id)
    assert all(t["configuration"]["codegen_opt"] == 3 for t in trials)


def test_builtin_quick_preset_on_a_synthetic_recording_then_report(tmp_path):
    rec = write_vecadd_recording(tmp_path / "rec", n=1 << 20, block=256)
    run = tmp_path / "quick"
    mneme_tune("-rdb", rec.path, "-rid", rec.dynamic_hash, "--space-preset", "quick", "--sampler", "tpe",
               "--trials", "12", "--seed", "0", "--results-dir", str(run), cwd=tmp_path)
    check_results(run, 12, rec.dynamic_hash)
    proc = subprocess.run([sys.executable, "-m", "mneme", "tune", "report", str(run)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=tune_env(tmp_path))
    # with matplotlib/plotly missing the report fails with the package to install, and nothing else
    assert proc.returncode == 0 or "pip install" in proc.stderr, proc.stderr


def test_tune_from_a_directory_holding_a_mneme_source_tree_without_native_parts(tmp_path):
    """A checkout's source tree in the current directory shadows nothing: the local servers, their workers
    and compile processes import the mneme this test imported (with its native engine)."""
    from mneme._internal.child_process import mneme_command

    checkout = tmp_path / "checkout"
    for package in ("mneme", "replay_server", "tuner"):
        shutil.copytree(REPO / package, checkout / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "lib"))
    assert not list((checkout / "mneme").glob("_engine*"))
    rec = write_vecadd_recording(tmp_path / "rec", n=1 << 20, block=256)
    run = tmp_path / "results"
    proc = subprocess.run(
        mneme_command("tune", "-rdb", rec.path, "--space-preset", "launch", "--launch-dim", "x", *common_flags(run)),
        cwd=checkout, env=tune_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"mneme tune failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    size = json.loads((run / "search_space.json").read_text())["size"]
    check_results(run, size, rec.dynamic_hash)
