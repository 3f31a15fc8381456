"""Building and running an exported reproducer in tests: with g++ or CMake, against the real driver or
a stand-in (``data/fake_libcuda.cpp``: device memory in host memory, the synthetic kernels run on the host)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parents[1] / "reproducer" / "templates" / "reproducer.cpp"
FAKE_DRIVER = Path(__file__).resolve().parent / "data" / "fake_libcuda.cpp"


def cuda_include() -> Path:
    """The folder holding cuda.h, or a skip saying it was not found."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(str(Path(nvcc).resolve().parents[1]))
    for root in roots:
        if root and (Path(root) / "include" / "cuda.h").is_file():
            return Path(root) / "include"
    pytest.skip("cuda.h not found (CUDA_HOME, /usr/local/cuda, next to nvcc): the reproducer builds against it")


def compile_with_gxx(binary: Path) -> Path:
    """The generated program compiled without CMake, as the folder's README says (warnings are errors here)."""
    return gxx(TEMPLATE, binary, "-ldl")


def fake_driver(folder: Path) -> dict[str, str]:
    """``data/fake_libcuda.cpp`` built as ``folder/libcuda.so.1``; the environment that makes the
    program load it as its driver."""
    gxx(FAKE_DRIVER, folder / "libcuda.so.1", "-shared", "-fPIC")
    return {**os.environ, "LD_LIBRARY_PATH": str(folder)}


def gxx(source: Path, output: Path, *flags: str) -> Path:
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if not compiler:
        pytest.skip("no C++ compiler (g++, c++ or $CXX)")
    command = [compiler, "-O1", "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{cuda_include()}", str(source),
               *flags, "-o", str(output)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return output


def cmake_build(folder: Path) -> Path:
    """``cmake -S folder -B folder/build && cmake --build folder/build``; the program's path."""
    include = cuda_include()
    if not shutil.which("cmake"):
        pytest.skip("cmake not found: the reproducer's folder builds with CMake")
    env = {**os.environ, "CUDAToolkit_ROOT": str(include.parent)}
    build = str(folder / "build")
    for step in (["cmake", "-S", str(folder), "-B", build], ["cmake", "--build", build]):
        done = subprocess.run(step, capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
    return folder / "build" / "reproducer"


def run_program(binary: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=300, env=env)


def fresh_compile_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiles of this test go to its own cache (``$MNEME_CACHE_DIR``), not the user's."""
    monkeypatch.setenv("MNEME_CACHE_DIR", str(tmp_path / "cache"))
    import mneme.replay.compile as compile_mod

    monkeypatch.setattr(compile_mod, "_default_cache", None)
