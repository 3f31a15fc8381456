"""Fixtures of the LLVM tier tests: the vecops test program, built or as committed records."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from llvm_test_support import DATA, PTXAS, WRAPPER_CXX, build_tools_missing, wrapper_env

from mneme.llvm.section import decode_records


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
