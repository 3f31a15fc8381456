"""The example workloads build here with plain nvcc (no GPU needed) and behave
on bad input; the CuPy example imports and skips cleanly without CuPy.

Running them to PASS needs a GPU: tests/gpu/test_examples.py.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
# example folder -> program name
CUDA_EXAMPLES = {"minife_cg": "cg", "stencil3d": "stencil", "matmul_tiled": "matmul"}
CUPY_EXAMPLE = EXAMPLES / "cupy_nvrtc" / "cupy_kernels.py"

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA toolkit) is not on PATH")


def _gpu_present() -> bool:
    from mneme.testing.gpu import gpu_unavailable_reason

    return gpu_unavailable_reason() is None


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """Build every example once with the top-level Makefile, out of tree."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc (CUDA toolkit) is not on PATH")
    build = tmp_path_factory.mktemp("examples-build")
    proc = subprocess.run(
        ["make", "-C", str(EXAMPLES), f"BUILD={build}", "-j4"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"make failed:\n{proc.stdout}\n{proc.stderr}"
    return build


@needs_nvcc
@pytest.mark.parametrize("folder,program", sorted(CUDA_EXAMPLES.items()))
def test_example_builds_an_executable(built, folder, program):
    path = built / folder / program
    assert path.is_file() and os.access(path, os.X_OK)
    # static cudart (nvcc's default, spelled out): no libcudart.so dependency to ship
    ldd = subprocess.run(["ldd", str(path)], capture_output=True, text=True)
    assert "libcudart" not in ldd.stdout


@needs_nvcc
@pytest.mark.parametrize("folder", sorted(CUDA_EXAMPLES))
def test_arch_is_overridable(folder):
    proc = subprocess.run(
        ["make", "-n", "-B", "-C", str(EXAMPLES / folder), "ARCH=sm_80", "BUILD=/nonexistent"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "-arch=sm_80" in proc.stdout and "-arch=sm_90" not in proc.stdout


@needs_nvcc
@pytest.mark.parametrize(
    "folder,program,args",
    [
        ("minife_cg", "cg", ["0"]),
        ("minife_cg", "cg", ["8", "x"]),
        ("stencil3d", "stencil", ["100000"]),
        ("matmul_tiled", "matmul", ["256", "33"]),  # 33x33 threads exceed a block
    ],
)
def test_bad_arguments_exit_2_with_usage(built, folder, program, args):
    proc = subprocess.run([str(built / folder / program), *args], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "usage:" in proc.stderr
    assert "PASS" not in proc.stdout


@needs_nvcc
@pytest.mark.parametrize("folder,program", sorted(CUDA_EXAMPLES.items()))
def test_without_a_gpu_the_example_fails_clearly(built, folder, program):
    if _gpu_present():
        pytest.skip("a GPU is present: tests/gpu/test_examples.py runs the examples")
    # the smallest problem each example accepts keeps the host part quick
    small = {"cg": ["6", "3"], "stencil": ["8", "2"], "matmul": ["64", "8"]}[program]
    proc = subprocess.run([str(built / folder / program), *small], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "PASS" not in proc.stdout
    assert "FAIL:" in proc.stderr and "cuda" in proc.stderr.lower()


def _load_cupy_example():
    spec = importlib.util.spec_from_file_location("cupy_kernels_example", CUPY_EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cupy_example_compiles_as_python():
    compile(CUPY_EXAMPLE.read_text(), str(CUPY_EXAMPLE), "exec")


def test_cupy_example_imports_without_cupy():
    module = _load_cupy_example()
    assert callable(module.main)
    line = module.report_kernel_time("row_softmax", [0.5, 0.25, 1.0])
    assert line == "KERNEL_TIME kernel=row_softmax launches=3 mean_us=583.333 median_us=500.000 min_us=250.000"


def test_cupy_example_skips_cleanly_without_cupy():
    module = _load_cupy_example()
    if module.import_cupy() is not None:
        pytest.skip("CuPy is installed here: the GPU tests run the example")
    proc = subprocess.run([sys.executable, str(CUPY_EXAMPLE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == module.SKIP_EXIT_STATUS
    assert "CuPy is not installed" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cupy_example_rejects_bad_arguments():
    proc = subprocess.run(
        [sys.executable, str(CUPY_EXAMPLE), "--rows", "-3"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "--rows" in proc.stderr


@needs_nvcc
def test_cupy_kernel_sources_compile_with_nvcc(tmp_path):
    """The NVRTC sources are valid CUDA C++: nvcc compiles them to PTX here."""
    module = _load_cupy_example()
    source = tmp_path / "kernels.cu"
    source.write_text(
        module.SCALE_ADD_SOURCE
        + module.ROW_SOFTMAX_SOURCE
        + "\ntemplate __global__ void row_softmax<float>(const float*, float*, int);\n"
    )
    ptx = tmp_path / "kernels.ptx"
    proc = subprocess.run(
        ["nvcc", "-arch=sm_90", "--std=c++17", "-ptx", str(source), "-o", str(ptx)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    text = ptx.read_text()
    assert ".entry scale_add" in text
    assert "row_softmax" in text
