"""The thread programs (tests/gpu/programs/threads) compile with nvcc here, without a GPU, so a syntax error is
caught before a GPU session; the cuBLAS variants where cublas_v2.h is installed (skipped with the reason
elsewhere). Running them under `mneme record`: tests/gpu/test_threads.py and threads/diagnose.sh. This module
sits outside tests/gpu/, whose tests are skipped where no GPU is usable."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

THREADS = Path(__file__).resolve().parent / "gpu" / "programs" / "threads"
PROGRAMS = {
    "threads_managed.cu": [],
    "threads_omp.cu": ["-Xcompiler", "-fopenmp"],
    "threads_streams.cu": [],
    "slow_kernels.cu": [],
}


def nvcc() -> str:
    found = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(found).exists():
        pytest.skip("nvcc (CUDA toolkit) is not installed: the thread programs cannot be compiled here")
    return found


def test_the_sources_are_the_ones_listed():
    assert sorted(p.name for p in THREADS.glob("*.cu")) == sorted(PROGRAMS)


@pytest.mark.parametrize("source", sorted(PROGRAMS))
def test_compiles(tmp_path, source):
    proc = subprocess.run([nvcc(), "-O2", "-arch=sm_90", *PROGRAMS[source], "-o", str(tmp_path / "p"), str(THREADS / source)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


def cublas_include(compiler: str) -> Path | None:
    homes = [Path(compiler).resolve().parents[1], Path("/usr/local/cuda")]
    homes += [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    for home in homes:
        if (home / "include" / "cublas_v2.h").exists():
            return home / "include"
    return None


@pytest.mark.parametrize("source", ["threads_managed.cu", "threads_omp.cu"])
def test_cublas_variant_compiles(tmp_path, source):
    include = cublas_include(nvcc())
    if include is None:
        pytest.skip("cuBLAS headers are not installed here (no cublas_v2.h in the CUDA toolkit)")
    proc = subprocess.run([nvcc(), "-O2", "-arch=sm_90", *PROGRAMS[source], "-DWITH_CUBLAS", f"-I{include}", "-c", "-o",
                           str(tmp_path / "p.o"), str(THREADS / source)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
