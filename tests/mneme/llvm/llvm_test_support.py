"""Helpers of the LLVM tier tests: paths, the instrumented-build environment, a ptxas check."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
REPO = Path(__file__).resolve().parents[3]
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
