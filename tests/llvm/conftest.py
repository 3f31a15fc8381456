"""Fixtures of the LLVM tier tests: the vecops test program, built or as committed records."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mneme.llvm.section import decode_records

DATA = Path(__file__).resolve().parent / "data"
REPO = Path(__file__).resolve().parents[2]
WRAPPER_CXX = REPO / "mneme" / "toolchain" / "bin" / "mneme-c++"
PTXAS = Path(os.environ.get("CUDA_PATH", "/usr/local/cuda")) / "bin" / "ptxas"


def build_tools_missing() -> str | None:
    """Why the instrumented build cannot run here, or None."""
    from mneme.toolchain import device_ir

    if not shutil.which("nvcc") and not Path("/usr/local/cuda/bin/nvcc").exists():
        return "nvcc (CUDA toolkit) not found"
    try:
        device_ir.find_tools()
    except device_ir.DeviceIRError as exc:
        return str(exc)
    return None


def wrapper_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["MNEME_IR_STRICT"] = "1"
    if not shutil.which("nvcc"):
        env["PATH"] = "/usr/local/cuda/bin" + os.pathsep + env["PATH"]
    return env


def ptxas_check(ptx: str, tmp_path: Path, arch: str = "sm_90") -> subprocess.CompletedProcess:
    source = tmp_path / "kernel.ptx"
    source.write_text(ptx)
    return subprocess.run(
        [str(PTXAS), f"-arch={arch}", str(source), "-o", str(tmp_path / "kernel.cubin")],
        capture_output=True, text=True, check=False,
    )


@pytest.fixture(scope="session")
def vecops_records() -> dict[str, bytes]:
    """kernel name -> bitcode, from the committed records (no clang needed)."""
    return {r.kernels[0]: r.bitcode for r in decode_records((DATA / "vecops.records").read_bytes())}


@pytest.fixture(scope="session")
def llvmlite_available() -> None:
    pytest.importorskip("llvmlite", reason="the LLVM tier needs llvmlite (pip install llvmlite==0.50.0)")


@pytest.fixture(scope="session")
def ptxas() -> Path:
    if not PTXAS.exists():
        pytest.skip(f"ptxas not found at {PTXAS}")
    return PTXAS


@pytest.fixture(scope="session")
def vecops_app(tmp_path_factory) -> Path:
    """vecops.cu built in one step through the c++ wrapper."""
    reason = build_tools_missing()
    if reason:
        pytest.skip(f"instrumented build unavailable: {reason}")
    out = tmp_path_factory.mktemp("vecops") / "vecops"
    proc = subprocess.run(
        [str(WRAPPER_CXX), "-arch=sm_90", "-o", str(out), str(DATA / "vecops.cu")],
        capture_output=True, text=True, env=wrapper_env(), check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return out
