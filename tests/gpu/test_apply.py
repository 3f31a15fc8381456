"""`mneme run --apply` on a real program: record it, tune it with `mneme tune`, run it with the result applied.

The program (tests/gpu/programs/apply_target.cu) launches its kernel with the
recorded shape and with another grid, and checks its result on the host.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mneme.testing.gpu import child_env  # noqa: E402

pytestmark = pytest.mark.gpu
PROGRAMS = Path(__file__).resolve().parent / "programs"
KERNEL = "_Z11saxpy_applyifPKfPf"
LAUNCHES = 4
WRONG_SOURCE = """
__global__ void saxpy_apply(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i] + 1.0f;  // not what the application computes
}
"""


def _nvcc() -> str:
    found = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(found).exists():
        pytest.skip("nvcc not found: the apply tests build a CUDA program")
    return found


def _arch() -> str:
    out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=30).stdout.split()
    return "sm_" + out[0].replace(".", "") if out else "sm_90"


def mneme(*args: str, cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mneme", *args], cwd=cwd, env=env or child_env(MNEME_CACHE_DIR=str(cwd / "cache")),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> dict:
    """The program, and a results directory of `mneme tune` on its recorded launch (a recompiled best)."""
    work = tmp_path_factory.mktemp("apply")
    nvcc, arch = _nvcc(), _arch()
    program = work / "apply_target"
    subprocess.run([nvcc, "-O2", f"-arch={arch}", "-o", program, PROGRAMS / "apply_target.cu"], check=True)
    proc = mneme("record", "-rdb", str(work / "rec"), "--kernel", "saxpy_apply", "-mr", "1", "--",
                 str(program), "2", cwd=work)
    assert proc.returncode == 0 and "PASS" in proc.stdout, proc.stderr[-3000:]
    (db,) = [p for p in (work / "rec").glob("*.json")]
    record_id = next(iter(json.loads(db.read_text())["instances"]))
    run = work / "results"
    proc = mneme("tune", "-rdb", str(db), "-rid", record_id, "--space-preset", "launch", "--launch-dim", "x",
                 "--launch-safety", "aggressive", "--fixed-codegen-opt", "2", "--sampler", "exhaustive",
                 "--iterations", "3", "--warmup", "1", "--workers", "1", "--results-dir", str(run), cwd=work)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wrong = work / "wrong.cubin"
    (work / "wrong.cu").write_text(WRONG_SOURCE)
    subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-o", wrong, work / "wrong.cu"], check=True)
    best = json.loads((run / "best.json").read_text())["best"]
    return {"work": work, "program": program, "results": run, "best": best, "wrong": wrong}


def apply_run(tuned: dict, *flags: str, args: tuple[str, ...] = (), env_extra: dict | None = None):
    env = child_env(MNEME_CACHE_DIR=str(tuned["work"] / "cache"), MNEME_VERBOSE="1", **(env_extra or {}))
    return mneme("run", "--apply", str(tuned["results"]), *flags, "--", str(tuned["program"]), *args,
                 cwd=tuned["work"], env=env)


def report_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("mneme apply: saxpy_apply") and " of " in line
             and "launch " not in line.split(":")[1]]
    assert lines, stderr[-3000:]
    return lines[-1]


def test_matching_launches_run_the_tuned_code_and_shape(tuned):
    proc = apply_run(tuned, args=(str(LAUNCHES),))
    assert proc.returncode == 0 and "PASS" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    block = tuned["best"]["configuration"]["block"]
    grid = tuned["best"]["configuration"]["grid"]
    applied = re.findall(r"launch \d+: applied \(grid (\S+), block (\S+), shared 0\)", proc.stderr)
    assert len(applied) == LAUNCHES
    assert set(applied) == {(f"{grid['x']}x{grid['y']}x{grid['z']}", f"{block['x']}x{block['y']}x{block['z']}")}
    line = report_line(proc.stderr)
    assert f"applied {LAUNCHES} of {LAUNCHES + 2} launches" in line
    assert "left alone 2 (2 because grid" in line


def test_other_launch_shapes_are_left_alone_unless_similar_is_asked(tuned):
    proc = apply_run(tuned, args=("1",))
    assert proc.returncode == 0 and "PASS" in proc.stdout
    assert len(re.findall(r"left alone: grid 4688x1x1 differs from the recorded 16384x1x1", proc.stderr)) == 2
    similar = apply_run(tuned, "--apply-to", "similar", args=("1",))
    assert similar.returncode == 0 and "PASS" in similar.stdout, similar.stdout + similar.stderr[-3000:]
    assert "applied 3 of 3 launches" in report_line(similar.stderr)


def test_apply_verify_compares_on_the_device_and_rolls_back_a_wrong_cubin(tuned, tmp_path):
    good = apply_run(tuned, "--apply-verify", "2", args=(str(LAUNCHES),))
    assert good.returncode == 0 and "PASS" in good.stdout
    assert "comparisons passed 2 of 2" in report_line(good.stderr)

    # The same plan, but the tuned code computes something else: caught at its first launch, rolled back.
    from mneme.apply.plan import ApplyOptions, build_plan
    from mneme.apply.results import read_results
    from mneme.apply.session import application_environment, read_report

    plan = build_plan([read_results(tuned["results"])], ApplyOptions(verify=2), tmp_path)
    plan.entries = [replace(plan.entries[0], code_path=tuned["wrong"])]
    env = application_environment(plan.write(tmp_path / "plan.txt"), tmp_path / "report.jsonl", child_env())
    proc = subprocess.run([str(tuned["program"]), str(LAUNCHES)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "PASS" in proc.stdout, proc.stdout + proc.stderr[-3000:]  # the original's results
    assert "results differ from the original's" in proc.stderr
    (report,) = read_report(tmp_path / "report.jsonl")
    assert report.kernel == KERNEL and report.applied == 0 and report.verify_failed == 1
    assert sum(report.left_alone.values()) == LAUNCHES + 2


def test_another_gpu_gets_nothing_unless_forced(tuned, tmp_path):
    from mneme.apply.plan import ApplyOptions, build_plan
    from mneme.apply.results import read_results
    from mneme.apply.session import application_environment, read_report

    for force in (False, True):
        plan = build_plan([read_results(tuned["results"])], ApplyOptions(force=force), tmp_path)
        plan.compute_capability = (7, 0)  # as if tuned on a V100
        env = application_environment(plan.write(tmp_path / "plan.txt"), tmp_path / "report.jsonl", child_env())
        proc = subprocess.run([str(tuned["program"]), "1"], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "PASS" in proc.stdout
        (report,) = read_report(tmp_path / "report.jsonl")
        if force:
            assert report.applied == 1
        else:
            assert report.applied == 0 and any("tuned on sm_70" in why for why in report.left_alone)


def test_an_application_exiting_early_leaves_no_stray_state(tuned, tmp_path):
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    proc = apply_run(tuned, "--apply-verify", "1", args=(str(LAUNCHES), "1"), env_extra={"TMPDIR": str(private_tmp)})
    assert proc.returncode == 3 and "exiting early after launch 1" in proc.stdout
    assert "applied 2 of 2 launches, comparisons passed 1 of 1" in report_line(proc.stderr)
    assert list(private_tmp.iterdir()) == []  # the plan and the tuned code went with the run
    after = subprocess.run([str(tuned["program"]), "1"], capture_output=True, text=True, timeout=120,
                           env={k: v for k, v in os.environ.items() if not k.startswith("MNEME_APPLY")})
    assert after.returncode == 0 and "PASS" in after.stdout  # a plain run afterwards is untouched
