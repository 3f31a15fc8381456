"""The block shapes recorded code accepts: PTX ``.reqntid``/``.maxntid`` and the cubin's ``.nv.info``.

The fixture is nvcc 13.0 output of tests/mneme/replay/data/block_shapes.cu (``__block_size__`` and
``__launch_bounds__``); where nvcc/ptxas are installed, the tests also build code here.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from mneme.errors import ArtifactError
from mneme.model.experiment import Dim3
from mneme.replay.block_limits import (
    BlockLimit,
    BlockLimits,
    cubin_limits,
    ptx_limits,
    recorded_block_limits,
)
from mneme.replay.nv_info import (
    EIATTR_MAX_THREADS,
    EIATTR_REQNTID,
    kernel_attributes,
    parse_attributes,
)

DATA = Path(__file__).parent / "data"
PTX = (DATA / "block_shapes.ptx").read_text()
CUBIN = (DATA / "block_shapes.sm_90.cubin").read_bytes()
EXPECTED = {
    "vecadd_fixed": (True, (128, 1, 1)),
    "tile_fixed": (True, (16, 8, 1)),
    "vecadd_capped": (False, (256, 1, 1)),
}

HANDWRITTEN_PTX = """.version 8.0
.target sm_90
.address_size 64

.visible .entry req64(
\t.param .u64 req64_param_0
)
.reqntid 64
{
\tret;
}

.visible .entry max32x4(
\t.param .u64 max32x4_param_0
)
.maxntid 32, 4
{
\tret;
}
"""


def _summary(limits) -> dict[bool, tuple[int, int, int]]:
    return {limit.required: limit.dims for limit in limits}


@pytest.mark.parametrize("kernel", [*EXPECTED, "vecadd_free"])
def test_nvcc_code_says_the_same_in_its_ptx_and_its_cubin(kernel):
    from_ptx, from_cubin = ptx_limits(PTX, kernel), cubin_limits(CUBIN, kernel)
    expected = {EXPECTED[kernel][0]: EXPECTED[kernel][1]} if kernel in EXPECTED else {}
    assert _summary(from_ptx) == _summary(from_cubin) == expected
    directive = "reqntid" if EXPECTED.get(kernel, (False,))[0] else "maxntid"
    assert all(limit.source == f"PTX .{directive}" for limit in from_ptx)
    assert all(limit.source == f"cubin EIATTR_{'REQNTID' if limit.required else 'MAX_THREADS'}" for limit in from_cubin)


def test_the_cubins_attribute_codes():
    codes = {a.code: a.dims() for a in kernel_attributes(CUBIN, "vecadd_fixed") if a.code == EIATTR_REQNTID}
    assert codes == {EIATTR_REQNTID: (128, 1, 1)}
    capped = [a.dims() for a in kernel_attributes(CUBIN, "vecadd_capped") if a.code == EIATTR_MAX_THREADS]
    assert capped == [(256, 1, 1)]
    assert kernel_attributes(CUBIN, "no_such_kernel") is None


def test_which_blocks_the_limits_allow():
    fixed = BlockLimits(ptx_limits(PTX, "tile_fixed"))
    assert fixed.required.dims == (16, 8, 1) and fixed.max_threads is None
    assert fixed.allows(Dim3(16, 8, 1)) and not fixed.allows(Dim3(8, 16, 1)) and not fixed.allows(Dim3(128, 1, 1))
    capped = BlockLimits((BlockLimit(False, (512, 1, 1), "PTX .maxntid"), BlockLimit(False, (32, 4, 1), "cubin x")))
    assert capped.required is None and capped.max_threads.threads == 128  # the tightest cap
    assert capped.allows(Dim3(64, 2, 1)) and not capped.allows(Dim3(256, 1, 1))
    assert BlockLimits().allows(Dim3(1024, 1, 1))
    assert fixed.required.describe() == "PTX .reqntid 16, 8, 1"


def test_ptxas_writes_the_attributes_the_reader_expects(tmp_path):
    ptxas = shutil.which("ptxas") or ("/usr/local/cuda/bin/ptxas" if Path("/usr/local/cuda/bin/ptxas").exists() else None)
    if ptxas is None:
        pytest.skip("no ptxas on this machine (the CUDA toolkit): the checked-in nvcc fixture is tested instead")
    source = tmp_path / "hand.ptx"
    source.write_text(HANDWRITTEN_PTX)
    subprocess.run([ptxas, "-arch=sm_90", str(source), "-o", str(tmp_path / "hand.cubin")], check=True)
    cubin = (tmp_path / "hand.cubin").read_bytes()
    assert _summary(cubin_limits(cubin, "req64")) == _summary(ptx_limits(HANDWRITTEN_PTX, "req64")) == {True: (64, 1, 1)}
    assert _summary(cubin_limits(cubin, "max32x4")) == _summary(ptx_limits(HANDWRITTEN_PTX, "max32x4")) == {
        False: (32, 4, 1)}


def test_the_fixture_is_what_nvcc_makes_of_its_source(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on this machine: the checked-in fixture cannot be rebuilt here")
    out = tmp_path / "rebuilt.cubin"
    subprocess.run([nvcc, "-cubin", "-arch=sm_90", "-o", str(out), str(DATA / "block_shapes.cu")], check=True)
    for kernel in (*EXPECTED, "vecadd_free"):
        assert _summary(cubin_limits(out.read_bytes(), kernel)) == _summary(cubin_limits(CUBIN, kernel))


def test_damaged_sections_are_artifact_errors():
    sval = bytes([4, EIATTR_REQNTID]) + struct.pack("<H", 12) + struct.pack("<III", 32, 2, 1)
    assert parse_attributes(sval + bytes([3, 0x1B, 0xFF, 0x00]))[0].dims() == (32, 2, 1)
    with pytest.raises(ArtifactError, match="runs past"):
        parse_attributes(sval[:-4])
    with pytest.raises(ArtifactError, match="unknown entry format 9"):
        parse_attributes(bytes([9, 1, 0, 0]))
    with pytest.raises(ArtifactError, match="ends inside an entry"):
        parse_attributes(sval + b"\x04")
    with pytest.raises(ArtifactError, match="cannot be read"):
        kernel_attributes(b"not an elf file at all, long enough for a header" * 2, "k")


def _recorded(name: str, ptx: str | None, cubin: bytes | None):
    code = SimpleNamespace(ptx="ref" if ptx is not None else None, cubin="ref" if cubin is not None else None)
    files = {"ptx": (ptx or "").encode(), "cubin": cubin}
    return SimpleNamespace(kernel_name=name, code=code, load_code=files.__getitem__)


def test_a_recordings_limits_come_from_its_ptx_else_its_cubin():
    from_ptx = recorded_block_limits(_recorded("vecadd_fixed", PTX, CUBIN))
    assert from_ptx.required.source == "PTX .reqntid"
    sass_only = recorded_block_limits(_recorded("vecadd_fixed", None, CUBIN))
    assert sass_only.required.source == "cubin EIATTR_REQNTID" and sass_only.required.dims == (128, 1, 1)
    unreadable = recorded_block_limits(_recorded("vecadd_fixed", None, b"\x7fELF" + bytes(60)))
    assert unreadable.limits == () and "cannot be read" in unreadable.unread
    assert recorded_block_limits(SimpleNamespace(kernel_name="k")) == BlockLimits()  # no code to read
