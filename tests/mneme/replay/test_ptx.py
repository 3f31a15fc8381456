"""PTX rewriting: parameter layout, launch bounds, specialization of arguments and dimensions."""

from __future__ import annotations

import struct

import pytest

from mneme.errors import ConfigurationError
from mneme.replay import ptx as ptxrw
from mneme.testing import vecadd_code

K = vecadd_code.KERNEL_NAME

STRUCT_PTX = """
.version 8.0
.target sm_90
.address_size 64
.visible .entry k(
\t.param .u8 k_param_0,
\t.param .align 8 .b8 k_param_1[16],
\t.param .f32 k_param_2,
\t.param .f64 k_param_3
)
.maxntid 64, 1, 1
{
\t.reg .f32 %f<2>;
\t.reg .f64 %fd<2>;
\t.reg .b16 %rs<2>;
\t.reg .b32 %r<3>;
\tld.param.u8 %rs1, [k_param_0];
\tld.param.u32 %r1, [k_param_1+8];
\tld.param.f32 %f1, [k_param_2];
\tld.param.f64 %fd1, [k_param_3];
\tmov.u32 %r2, %nctaid.y;
\tret;
}
"""


def test_entry_parameters_have_the_buffer_layout():
    span = ptxrw.find_entry(vecadd_code.PTX, K)
    assert [(p.offset, p.size) for p in span.params] == [(0, 8), (8, 8), (16, 8), (24, 4)]
    span = ptxrw.find_entry(STRUCT_PTX, "k")
    assert [(p.offset, p.size) for p in span.params] == [(0, 1), (8, 16), (24, 4), (32, 8)]


def test_missing_entry_names_the_entries_there():
    with pytest.raises(ConfigurationError, match="no .entry nope.*_Z6vecadd"):
        ptxrw.find_entry(vecadd_code.PTX, "nope")


def test_launch_bounds_are_directives_on_the_entry():
    out = ptxrw.set_launch_bounds(vecadd_code.PTX, K, 256, 4)
    header = out[out.index(".entry") : out.index("{", out.index(".entry"))]
    assert ".maxntid 256, 1, 1" in header and ".minnctapersm 4" in header
    # Existing directives are replaced, not duplicated; min_blocks 0 leaves .minnctapersm out.
    out = ptxrw.set_launch_bounds(STRUCT_PTX, "k", 512, 0)
    assert out.count(".maxntid") == 1 and ".maxntid 512, 1, 1" in out and ".minnctapersm" not in out
    assert ptxrw.set_launch_bounds(out, "k", 512, 0) == out  # idempotent


def test_specialize_replaces_scalar_loads_with_exact_immediates():
    args = bytes([200]) + bytes(7) + struct.pack("<QQ", 0, 0xDEADBEEF) + struct.pack("<f", 1.5) + bytes(4)
    args += struct.pack("<d", -2.25)
    out = ptxrw.specialize_params(STRUCT_PTX, "k", args, scalar_offsets={0, 8, 24, 32})
    assert "mov.u16 %rs1, 200;" in out  # 8-bit loads become 16-bit moves
    assert f"mov.u32 %r1, {0xDEADBEEF};" in out  # a field of an aggregate (offset 8 + 8)
    assert "mov.f32 %f1, 0f3FC00000;" in out  # 1.5, bit exact
    assert "mov.f64 %fd1, 0dC002000000000000;" in out  # -2.25
    assert "ld.param" not in out.split("{", 1)[1]


def test_specialize_keeps_pointer_loads():
    args = struct.pack("<QQQi", 1, 2, 3, 4096)
    out = ptxrw.specialize_params(vecadd_code.PTX, K, args, scalar_offsets={24})
    body = out[out.index("{") :]
    assert body.count("ld.param.u64") == 3
    assert "mov.u32 %r2, 4096;" in body


def test_specialize_with_short_arguments_is_an_error():
    with pytest.raises(ConfigurationError, match="recorded arguments have"):
        ptxrw.specialize_params(vecadd_code.PTX, K, b"\0" * 8, scalar_offsets={24})


def test_specialize_dims_replaces_special_registers_only_in_the_entry():
    out = ptxrw.specialize_dims(vecadd_code.PTX, K, (4096, 1, 1), (256, 1, 1))
    assert "%ntid.x" not in out and "mov.u32 \t%r4, 256;" in out
    assert "%ctaid.x" in out and "%tid.x" in out  # indices stay
    out = ptxrw.specialize_dims(STRUCT_PTX, "k", (7, 9, 1), (64, 1, 1))
    assert "mov.u32 %r2, 9;" in out


def test_immediates_signed_and_unsigned():
    assert ptxrw.immediate("s32", struct.pack("<i", -5)) == "-5"
    assert ptxrw.immediate("u32", struct.pack("<i", -5)) == str(2**32 - 5)
    assert ptxrw.immediate("b64", struct.pack("<Q", 2**63)) == str(2**63)


def test_target_arch():
    assert ptxrw.target_arch(vecadd_code.PTX) == "sm_90"
