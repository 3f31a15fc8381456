"""Each example workload builds, runs on the GPU, checks its own result on the
host and prints PASS, with the KERNEL_TIME line of its main kernel.

These run the programs as a user would (`make`, then the program), with
problem sizes a little off the defaults where that exercises a different path
(non-cubic grid, partial tiles), and the defaults the headline uses.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from headline import default_arch, gpu_description
from headline_apps import build_examples, parse_kernel_times, verdict

REPO = Path(__file__).resolve().parents[2]

EXAMPLES = REPO / "examples"
pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """Every example built out of tree for this GPU's architecture (the headline's build)."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc (CUDA toolkit) is not on PATH")
    build = tmp_path_factory.mktemp("examples-gpu")
    build_examples(build, default_arch(gpu_description()), build / "build.log")
    return build


def _run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _assert_pass(proc: subprocess.CompletedProcess, kernel: str) -> dict[str, float]:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert verdict(proc.stdout) == "PASS", proc.stdout
    times = parse_kernel_times(proc.stdout)
    assert kernel in times, proc.stdout
    assert times[kernel]["launches"] >= 1
    assert 0 < times[kernel]["min_us"] <= times[kernel]["median_us"]
    return times[kernel]


@pytest.mark.parametrize("args", [[], ["24", "16", "40", "30"], ["7", "3"]])
def test_cg_solver_passes(built, args):
    times = _assert_pass(_run([str(built / "minife_cg" / "cg"), *args]), "spmv_csr")
    iterations = int(args[-1]) if len(args) in (2, 4) else 50
    assert times["launches"] == iterations + 1  # r0 = b - A*x0, then one per iteration


def test_cg_default_spmv_time_is_in_the_intended_range(built):
    """The default problem is sized for an SpMV of roughly 0.05 to 1 ms on current GPUs."""
    times = _assert_pass(_run([str(built / "minife_cg" / "cg")]), "spmv_csr")
    assert 20 <= times["median_us"] <= 2000, times


@pytest.mark.parametrize("args", [[], ["61", "5"], ["3", "1"]])
def test_stencil_passes(built, args):
    times = _assert_pass(_run([str(built / "stencil3d" / "stencil"), *args]), "jacobi7")
    assert times["launches"] == (int(args[1]) if args else 10)


@pytest.mark.parametrize("args", [[], ["1000", "32"], ["129", "8"], ["64", "1"]])
def test_matmul_passes(built, args):
    _assert_pass(_run([str(built / "matmul_tiled" / "matmul"), *args], timeout=300), "matmul_tiled")


def test_examples_run_target_runs_every_example(built):
    proc = subprocess.run(["make", "-s", "-C", str(EXAMPLES), "run", f"BUILD={built}"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASS") >= 3
    assert "FAIL" not in proc.stdout


def test_cupy_example_passes():
    pytest.importorskip("cupy", reason="CuPy is not installed on this machine")
    proc = _run([sys.executable, str(EXAMPLES / "cupy_nvrtc" / "cupy_kernels.py")], timeout=300)
    _assert_pass(proc, "row_softmax")


def test_cupy_example_odd_shape_passes():
    pytest.importorskip("cupy", reason="CuPy is not installed on this machine")
    proc = _run([sys.executable, str(EXAMPLES / "cupy_nvrtc" / "cupy_kernels.py"),
                 "--rows", "37", "--cols", "3001", "--repetitions", "2"], timeout=300)
    times = _assert_pass(proc, "row_softmax")
    assert times["launches"] == 2
