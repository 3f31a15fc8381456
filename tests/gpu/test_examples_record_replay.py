"""The full loop on the example workloads: `mneme record` each unmodified
program, then replay its main kernel from the recording and verify it
bit-exact against the recorded epilogue.

Problem sizes are small (a few MB) so the whole module takes seconds. What is
checked per workload: the program still prints PASS under recording, the
database of its main kernel exists, the recorded launch replays and verifies,
a launch shape that still covers the work verifies, and (where the kernel
depends on its shape) one that does not fails verification, so the check is
known to be able to fail.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import headline_apps as apps
import pytest
from headline_stages import baseline_configuration
from test_examples import built  # noqa: F401  (the module-scoped build of every example)

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.gpu

# workload -> small arguments
SMALL_ARGS = {
    "minife_cg": ["24", "6"],
    "stencil3d": ["48", "3"],
    "matmul_tiled": ["200", "16"],
}


def _record(workload: str, build: Path, tmp_path: Path, args: list[str]) -> apps.RecordedInstance:
    w = apps.workload(workload)
    record_dir = tmp_path / "rec"
    cmd = apps.record_command(record_dir, [*w.command(build), *args])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=apps.child_env())
    assert proc.returncode == 0, f"mneme record failed:\n{proc.stdout}\n{proc.stderr}"
    assert apps.verdict(proc.stdout) == "PASS", proc.stdout
    return apps.find_instance(record_dir, w.kernel_pattern)


def _replay(instance: apps.RecordedInstance, **changes):
    from mneme.recording.execution import RecordedExecution
    from mneme.replay import Replayer

    recording = RecordedExecution.from_json(instance.database)
    kernel = recording[instance.record_id]
    config = baseline_configuration(kernel)
    if changes:
        config = config.replace(**changes)
    replayer = Replayer(recording, instance.record_id)
    try:
        return kernel, replayer.run(config, iterations=3, warmup=1)
    finally:
        close = getattr(replayer, "close", None)
        if callable(close):
            close()


@pytest.mark.parametrize("workload", sorted(SMALL_ARGS))
def test_recorded_baseline_replays_bit_exact(built, tmp_path, workload):
    instance = _record(workload, built, tmp_path, SMALL_ARGS[workload])
    _, result = _replay(instance)
    assert result.verified, f"{result.status}: {result.error} {result.mismatches}"
    assert len(result.exec_time) == 4 and all(t > 0 for t in result.exec_time)


def test_cg_spmv_replays_with_another_block_size(built, tmp_path):
    """The SpMV loops grid-stride: any block size over the recorded grid covers the matrix."""
    instance = _record("minife_cg", built, tmp_path, SMALL_ARGS["minife_cg"])
    kernel, result = _replay(instance, block={"x": 128, "y": 1, "z": 1})
    assert result.verified, f"{result.status}: {result.error}"
    assert kernel.block_dim.x == 256  # the application's launch


def test_matmul_with_a_non_square_block_fails_verification(built, tmp_path):
    """The tiled kernel needs blockDim.x == blockDim.y; replay must catch the wrong product."""
    instance = _record("matmul_tiled", built, tmp_path, SMALL_ARGS["matmul_tiled"])
    _, result = _replay(instance, block={"x": 16, "y": 8, "z": 1})
    assert not result.verified
    assert result.status in ("failed_verification", "runtime_error", "invalid_launch")


def test_stencil_with_half_the_grid_fails_verification(built, tmp_path):
    instance = _record("stencil3d", built, tmp_path, SMALL_ARGS["stencil3d"])
    grid = instance.grid
    _, result = _replay(instance, grid={"x": grid["x"], "y": grid["y"], "z": max(1, grid["z"] // 2)})
    assert not result.verified
    assert result.status == "failed_verification"


def test_cupy_kernel_records_and_replays(tmp_path):
    pytest.importorskip("cupy", reason="CuPy is not installed on this machine")
    instance = _record("cupy_nvrtc", tmp_path, tmp_path, ["--rows", "64", "--cols", "512", "--repetitions", "2"])
    _, result = _replay(instance)
    assert result.verified, f"{result.status}: {result.error}"
