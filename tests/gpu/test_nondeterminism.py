"""Nondeterministic kernels, recorded unmodified: detection, ``--tolerance auto``, and honesty.

Five small programs (tests/gpu/programs/nondeterministic/) whose results depend on the
order of atomics: a float atomicAdd block reduction into one scalar, a grid-wide dot
product, a Jacobi step with an atomic residual, an atomic-index stream compaction
(output permuted run to run) and a float-weighted histogram. Each is recorded with
``mneme record`` and replayed with the real ``mneme replay``:

* ``--tolerance exact`` fails, and says which regions are nondeterministic;
* ``--tolerance auto`` verifies, naming the derived bound (stored beside the recording);
* a configuration that computes a wrong answer fails under ``auto``: each kernel has
  one thread per element and no grid-stride loop, so half the recorded grid (``-gidx``,
  a launch-shape knob of the tuner) drops half the elements.

``mneme tune`` on the reduction completes with verified trials and names the bound.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_record import mneme_record, programs, recorder_lib  # noqa: F401  (fixtures)

from mneme.format.database import DATABASE_NAME
from mneme.recording.execution import RecordedExecution
from mneme.replay.nondeterminism import sidecar_name
from mneme.testing.gpu import child_env

pytestmark = pytest.mark.gpu

# (program, kernel name substring, the regions' dtype, permuted output)
CASES = [
    ("reduce_atomic", "block_sum", "f32", False),
    ("dot", "dot", "f32", False),
    ("jacobi", "jacobi_step", "f32", False),
    ("compact", "compact", "i32", True),
    ("histogram", "weighted_histogram", "f32", False),
]


def record(recorder_lib: str, programs: Path, tmp_path: Path, program: str, kernel: str) -> tuple[str, str]:
    """(database path, first instance id) of ``program`` recorded unmodified."""
    rdb = tmp_path / "rdb"
    mneme_record(recorder_lib, rdb, [programs / program])
    databases = [RecordedExecution.from_json(db) for db in sorted(rdb.glob("*.json")) if DATABASE_NAME.fullmatch(db.name)]
    found = [rec for rec in databases if kernel in rec.kernel_name]
    assert len(found) == 1, f"{program}: expected one database of {kernel} in {sorted(rdb.iterdir())}"
    rec = found[0]
    return rec.path, sorted(rec.instances)[0]


def replay(db: str, rid: str, *flags: str, cwd: Path) -> tuple[int, dict, str]:
    proc = subprocess.run([sys.executable, "-m", "mneme", "replay", "-rdb", db, "-rid", rid, "--json", *flags],
                          cwd=cwd, env=child_env(MNEME_CACHE_DIR=str(cwd / "cache")), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode in (0, 1), f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.returncode, json.loads(proc.stdout), proc.stderr


@pytest.mark.parametrize("program,kernel,dtype,permuted", CASES, ids=[c[0] for c in CASES])
def test_exact_fails_with_the_report_auto_verifies_a_wrong_variant_fails(
    recorder_lib, programs, tmp_path, program, kernel, dtype, permuted  # noqa: F811
):
    db, rid = record(recorder_lib, programs, tmp_path, program, kernel)

    # exact: the recorded launch itself does not verify, and the report says why
    rc, out, _ = replay(db, rid, cwd=tmp_path)
    result = out["Result"]
    assert rc == 1 and result["status"] == "failed_verification", result
    findings = result["nondeterminism"]
    assert findings and all(f["classification"] == "nondeterministic" for f in findings), findings
    for f in findings:
        assert f["runs"] == 8 and f["distinct_outputs"] >= 2 and f["dtype"] == dtype
        assert f["permuted"] == permuted
        assert f["differing_elements"] >= 1
        if not permuted:
            assert f["max_ulp"] >= 1 and f["max_abs_diff"] > 0
    assert "nondeterministic" in result["error"] and "--tolerance auto" in result["error"]
    if program == "jacobi":  # the new iterate is deterministic: only the residual is reported
        assert len(findings) == 1 and findings[0]["elements"] == 1

    # auto: verified within the derived bound, stored with its provenance beside the recording
    rc, out, err = replay(db, rid, "--tolerance", "auto", cwd=tmp_path)
    result = out["Result"]
    assert rc == 0 and result["verified"], result["error"]
    assert "tolerance auto: derived from 8 runs" in err
    auto = {label: e for label, e in result["verified_within"].items() if e["source"] == "auto"}
    assert set(auto) == {f["region"] for f in findings}
    for entry in auto.values():
        assert entry["policy"].startswith(f"{dtype}:{'multiset' if permuted else 'ulp'}")
        assert entry["derived"]["runs"] == 8 and entry["derived"]["derived"]
        assert "worst" in entry
    sidecar = Path(db).parent / sidecar_name(Path(db).name)
    stored = json.loads(sidecar.read_text())["instances"][rid]
    assert stored["runs"] == 8 and set(stored["policies"]) == set(auto)

    # a wrong answer (half the grid: half the elements dropped) fails under auto
    rec = RecordedExecution.from_json(db)
    grid_x = rec[rid].grid_dim.x
    rc, out, _ = replay(db, rid, "--tolerance", "auto", "-gidx", str(grid_x // 2), cwd=tmp_path)
    result = out["Result"]
    assert rc == 1 and result["status"] == "failed_verification", result
    failed = {m["region"] for m in result["mismatches"]}
    assert failed & set(auto) or program == "jacobi"
    if program == "jacobi":  # honesty: the deterministic iterate differs, and it stays bitwise
        assert any(m.get("policy") == "bitwise" for m in result["mismatches"])


def test_tune_on_the_reduction_completes_with_the_derived_tolerance(recorder_lib, programs, tmp_path):  # noqa: F811
    db, rid = record(recorder_lib, programs, tmp_path, "reduce_atomic", "block_sum")
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "mneme", "tune", "-rdb", db, "-rid", rid, "--space-preset", "launch",
         "--launch-dim", "x", "--sampler", "exhaustive", "--iterations", "3", "--warmup", "1", "--workers", "1",
         "--tolerance-runs", "4", "--results-dir", str(run)],
        cwd=tmp_path, env=child_env(MNEME_CACHE_DIR=str(tmp_path / "cache")), capture_output=True, text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert "tolerance: derived from 4 runs of the baseline" in proc.stdout + proc.stderr  # the servers got N
    baseline = json.loads((run / "baseline.json").read_text())
    assert baseline["tolerance"]["provenance"]["runs"] == 4
    assert baseline["verified"] and baseline["tolerance"]["policies"]
    assert all(spec.startswith("f32:ulp:") for spec in baseline["tolerance"]["policies"].values())
    assert baseline["tolerance"]["nondeterminism"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["verified"] >= 1
    assert summary["verified_exact"] + summary["verified_within_tolerance"] == summary["verified"]
    assert summary["tolerance"]["policies"] == baseline["tolerance"]["policies"]
    trials = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    for t in trials:
        if t["status"] == "verified":
            within = t["result"]["verified_within"]
            assert within and all(e["policy"] in baseline["tolerance"]["policies"].values() for e in within.values())
    print("tune summary:", {k: summary[k] for k in ("trials", "verified", "verified_exact", "verified_within_tolerance")})


def test_engine_ulp_statistics_and_multiset_hashes_match_numpy():
    """The device statistics the detection relies on, against numpy on known data."""
    import numpy as np

    from mneme.format.policy import VerifyPolicy
    from mneme.replay.engine import require_driver
    from mneme.replay.nondeterminism import RunStats
    from mneme.replay.tolerance import engine_check, judge

    native = require_driver()
    ctx = native.Context(0)
    rng = np.random.default_rng(3)
    ref = rng.uniform(-4, 4, 4097).astype(np.float32)
    ulps = np.zeros(ref.size, dtype=np.int32)
    ulps[[5, 77, 4000]] = [1, -3, 7]
    got = (ref.view(np.int32) + np.where(ref < 0, -ulps, ulps)).view(np.float32)  # exact ULP steps
    buffers = [ctx.alloc(ref.nbytes) for _ in range(3)]
    for buf, data in zip(buffers, (got, ref, rng.permutation(ref))):
        ctx.upload(buf.ptr, data.tobytes())
    a, b, perm = buffers
    ((stats, counters),) = ctx.compare([engine_check(a.ptr, b.ptr, ref.nbytes, VerifyPolicy("f32", "ulp", 6), 4)])
    run = RunStats.from_engine(stats, counters)
    assert (run.differing, run.max_ulp) == (3, 7)
    assert run.max_abs == pytest.approx(float(np.abs(got.astype(np.float64) - ref).max()), rel=1e-12)
    assert run.multiset != run.expected_multiset and run.positional != run.expected_positional
    assert not judge(VerifyPolicy("f32", "ulp", 6), stats, counters, ref.nbytes).passed
    assert judge(VerifyPolicy("f32", "ulp", 7), *ctx.compare(
        [engine_check(a.ptr, b.ptr, ref.nbytes, VerifyPolicy("f32", "ulp", 7))])[0], ref.nbytes).passed
    # a permutation: same multiset, another order
    multiset = VerifyPolicy("f32", "multiset")
    ((stats, counters),) = ctx.compare([engine_check(perm.ptr, b.ptr, ref.nbytes, multiset)])
    verdict = judge(multiset, stats, counters, ref.nbytes)
    assert verdict.passed and verdict.report["mismatched_bytes"] > 0
    ((stats, counters),) = ctx.compare([engine_check(a.ptr, b.ptr, ref.nbytes, multiset)])
    assert not judge(multiset, stats, counters, ref.nbytes).passed
    for buf in buffers:
        buf.free()
