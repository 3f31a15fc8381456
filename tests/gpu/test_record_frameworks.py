"""PyTorch and Triton programs under `mneme record` with lazy module loading (issue 23).

The programs of bench/apps are recorded as a new user would (no options), with
the driver's lazy module loading: every recorded instance must replay
verified, the caching allocator's pool must not be captured (MBs per instance,
not GBs), a Triton kernel must carry its PTX (from Triton's cache) and tune
PTX-tier knobs, and a SASS-only kernel (cuBLAS's GEMM) must have the knobs it
cannot use refused by name. Skipped, with the reason, where torch or triton is
not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_record import mneme_record, recorder_lib  # noqa: F401  (fixture)
from test_record_replay import assert_verified, replay_all
from test_tune import common_flags, mneme_tune, tune_env

from mneme.recording.execution import RecordedExecution
from mneme.store.summary import summarize

pytestmark = pytest.mark.gpu
APPS = Path(__file__).resolve().parents[2] / "bench" / "apps"
#: What one instance of a small PyTorch op may capture, prologue and epilogue (the pool's segments it
#: reaches: 2 or 20 MiB each, cuBLAS's workspace for a GEMM; the whole pool is GBs in a real program).
MAX_INSTANCE_BYTES = 128 << 20


def needs(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (the framework tests need them; CI installs neither)")


def databases(rdb: Path) -> list[RecordedExecution]:
    return [RecordedExecution.from_json(db) for db in sorted(rdb.glob("*.json"))]


@pytest.fixture(scope="module")
def torch_rdb(recorder_lib, tmp_path_factory):  # noqa: F811
    needs("torch")
    rdb = tmp_path_factory.mktemp("torch") / "rdb"
    proc = mneme_record(recorder_lib, rdb, [sys.executable, APPS / "torch_program.py"])
    return rdb, proc


@pytest.fixture(scope="module")
def triton_rdb(recorder_lib, tmp_path_factory):  # noqa: F811
    needs("torch", "triton")
    tmp = tmp_path_factory.mktemp("triton")
    rdb = tmp / "rdb"
    cache = tmp / "triton-cache"
    os.environ["TRITON_CACHE_DIR"] = str(cache)  # the recorded program's and the agent's (child_env copies it)
    try:
        proc = mneme_record(recorder_lib, rdb, [sys.executable, APPS / "triton_program.py"], "--kernel", "add_kernel")
    finally:
        del os.environ["TRITON_CACHE_DIR"]
    return rdb, proc


def test_pytorch_ops_record_under_lazy_loading_and_replay_verified(torch_rdb):
    rdb, proc = torch_rdb
    assert "torch_program: checksum" in proc.stdout  # the program's own output, unchanged
    assert "parameter layout unknown" not in proc.stderr, proc.stderr
    recs = databases(rdb)
    assert len(recs) >= 3, [r.kernel_name for r in recs]  # elementwise, GEMM, softmax at least
    for rec in recs:
        assert_verified(replay_all(rec))


def test_pytorch_instances_capture_megabytes_not_the_pool(torch_rdb):
    rdb, proc = torch_rdb
    assert "PyTorch caching allocator detected" in proc.stderr, proc.stderr
    summary = summarize(str(rdb))
    sizes = [i.captured_bytes for r in summary.recordings for i in r.instances]
    assert sizes and 0 < max(sizes) <= MAX_INSTANCE_BYTES, sizes


def test_a_sass_only_kernel_has_its_ptx_knobs_refused_by_name(torch_rdb, tmp_path):
    rdb, _ = torch_rdb
    sass_only = [r for r in databases(rdb) if r.code.ptx is None]
    if not sass_only:
        pytest.skip(f"every recorded kernel carries PTX here: {[r.kernel_name for r in databases(rdb)]}")
    rec = sass_only[0]
    record_id = sorted(rec.instances)[0]
    space = json.loads(mneme_tune("--record-database", rec.path, "--record-id", record_id, "--print-space",
                                  cwd=tmp_path).stdout)
    knobs = space["builtin"]["knobs"]
    assert knobs["apply"] == ["block_shape"] and "without PTX" in knobs["refused"]["codegen_opt"]
    assert space["dimensions"]["codegen_opt"]["type"] == "fixed"
    refused = subprocess.run([sys.executable, "-m", "mneme", "tune", "--record-database", rec.path, "--record-id",
                              record_id, "--fixed-codegen-opt", "1", "--print-space"], cwd=tmp_path,
                             env=tune_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "codegen_opt (--fixed-codegen-opt)" in refused.stderr, refused.stderr
    # The baseline (its recorded cubin) still replays verified.
    run = tmp_path / "sass-baseline"
    mneme_tune("--record-database", rec.path, "--record-id", record_id, "--baseline-only", *common_flags(run),
               cwd=tmp_path)
    assert json.loads((run / "baseline.json").read_text())["verified"]


def test_a_triton_kernel_records_with_its_ptx_and_replays_verified(triton_rdb):
    rdb, proc = triton_rdb
    assert "triton_program: out[-1]" in proc.stdout
    (rec,) = databases(rdb)
    assert "add_kernel" in rec.kernel_name
    assert rec.code.ptx is not None, "no PTX found in Triton's cache"
    assert ".entry add_kernel" in rec.load_code("ptx").decode()
    assert_verified(replay_all(rec))


def test_a_triton_kernel_tunes_ptx_tier_knobs(triton_rdb, tmp_path):
    rdb, _ = triton_rdb
    (rec,) = databases(rdb)
    record_id = sorted(rec.instances)[0]
    run = tmp_path / "triton-tune"
    # Triton's indexing fixes the block shape (its BLOCK constexpr): tune codegen levels and launch bounds.
    mneme_tune("--record-database", rec.path, "--record-id", record_id, "--launch-dim", "none",
               "--codegen-opt-range", "1", "3", "--launch-bounds-space", "on-off", *common_flags(run), cwd=tmp_path)
    trials = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    recompiled = [t for t in trials if t["configuration"]["codegen_opt"] != 3 or t["configuration"]["set_launch_bounds"]]
    assert recompiled and all(t["status"] == "verified" for t in recompiled), [
        (t["configuration"], t["status"], t["error"]) for t in trials]
