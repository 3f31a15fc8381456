"""PTX out of nvcc-built executables: fatbin containers, zstd-compressed entries, the right kernel."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from record_agent import fatbin

SOURCE = r"""
__global__ void first_kernel(float* x) { x[threadIdx.x] *= 2.0f; }
__global__ void second_kernel(int* y, int k) { y[threadIdx.x] += k; }
int main() { return 0; }
"""


@pytest.fixture(scope="module")
def executable(tmp_path_factory) -> Path:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(nvcc).exists():
        pytest.skip("nvcc not available")
    d = tmp_path_factory.mktemp("fatbin")
    (d / "k.cu").write_text(SOURCE)
    subprocess.run([nvcc, "-arch=sm_90", "-o", d / "k", d / "k.cu"], check=True, capture_output=True)
    return d / "k"


def test_executable_fatbin_has_ptx_and_cubins(executable):
    blob = fatbin.executable_fatbin(executable)
    assert blob
    entries = list(fatbin.iter_entries(blob))
    assert any(e.kind == fatbin.KIND_ELF and e.data[:4] == b"\x7fELF" for e in entries)
    ptx = [e for e in entries if e.is_ptx]
    assert ptx and all(e.arch == 90 for e in ptx) and b".version" in ptx[0].data


def test_find_ptx_picks_the_module_defining_the_kernel(executable):
    blob = fatbin.executable_fatbin(executable)
    text = fatbin.find_ptx(blob, "_Z13second_kernelPii", 90)
    assert text is not None and fatbin.ptx_defines(text, "_Z13second_kernelPii")
    assert fatbin.find_ptx(blob, "_Z13second_kernelPii", 80) is None  # no PTX at or below compute_80
    assert fatbin.find_ptx(blob, "no_such_kernel", 90) is None


def test_not_a_fatbin_yields_nothing(tmp_path):
    assert list(fatbin.iter_entries(b"\0" * 64 + b"garbage")) == []
    (tmp_path / "x").write_bytes(b"not an elf")
    assert fatbin.executable_fatbin(tmp_path / "x") is None


def test_bitcode_of_an_instrumented_build(executable, tmp_path):
    """Programs built through `mneme config cxx` carry kernel bitcode in .mneme_bitcode; the agent finds it by kernel."""
    objcopy = shutil.which("objcopy")
    if not objcopy:
        pytest.skip("objcopy not available")
    from mneme.llvm.section import SECTION_NAME, BitcodeRecord, encode_records

    records = [BitcodeRecord(("_Z13second_kernelPii",), b"BC\xc0\xde second"), BitcodeRecord(("_Z12first_kernelPf",), b"BC\xc0\xde first")]
    (tmp_path / "section.bin").write_bytes(encode_records(records))
    instrumented = tmp_path / "instrumented"
    subprocess.run([objcopy, "--add-section", f"{SECTION_NAME}={tmp_path / 'section.bin'}", str(executable), str(instrumented)], check=True)
    assert fatbin.executable_bitcode(instrumented, "_Z13second_kernelPii") == b"BC\xc0\xde second"
    assert fatbin.executable_bitcode(instrumented, "nothing") is None
    assert fatbin.executable_bitcode(executable, "_Z13second_kernelPii") is None
