"""Relocation: translating recorded addresses, finding and patching pointers, covering pages."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from mneme.replay.placement import pages_covering
from mneme.replay.relocation import Move, RelocationMap, read_values

A, B = 0x7F0000000000, 0x7F0000200000


def rmap() -> RelocationMap:
    return RelocationMap([Move(A, 0x1000, 0x500000000), Move(B, 0x100, B)])


def test_translate():
    m = rmap()
    assert m.translate(A) == 0x500000000 and m.translate(A + 0xFFF) == 0x500000FFF
    assert m.translate(A + 0x1000) is None  # one past the end is not inside
    assert m.translate(B + 8) == B + 8 and m.translate(0) is None
    assert not m.is_identity and RelocationMap([Move(B, 1, B)]).is_identity
    with pytest.raises(ValueError, match="overlap"):
        RelocationMap([Move(A, 0x1000, 0), Move(A + 8, 8, 0)])


def test_pointer_sites_are_aligned_on_device_addresses():
    data = bytearray(4) + struct.pack("<QQQ", A + 16, 12345, B) + bytes(4)
    # data[0] sits at an address = 4 (mod 8): the values at offsets 4, 12, 20 are the aligned ones.
    m = rmap()
    sites = m.pointer_sites(data, start_alignment=4)
    assert sites.tolist() == [4, 20]
    values = read_values(data, sites)
    assert values.tolist() == [A + 16, B]
    m.patch(data, sites, values)
    assert struct.unpack_from("<QQQ", data, 4) == (0x500000010, 12345, B)
    assert m.pointer_sites(data, start_alignment=0).tolist() == []  # misaligned view: nothing


def test_patch_args_translates_pointer_arguments_only():
    args = struct.pack("<QQi", A + 4, 77, 9)
    out = rmap().patch_args(args, [0, 8])
    assert struct.unpack("<QQi", out) == (0x500000004, 77, 9)


def test_pages_covering_merges_and_aligns():
    g = 2 << 20
    spans = pages_covering([(A + 10, 100), (A + g - 1, 2), (A + 5 * g, g)], A, g)
    assert spans == [(0, 2 * g), (5 * g, g)]
    assert pages_covering([(A, 0)], A, g) == []


def test_values_are_unsigned_64_bit():
    data = np.array([2**64 - 1], dtype="<u8").tobytes()
    assert read_values(data, np.array([0])).tolist() == [2**64 - 1]
