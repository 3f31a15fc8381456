"""The hash definitions are part of the format: golden values catch any change."""

import hashlib
import struct

import pytest

from mneme.format.hashing import dynamic_hash, static_hash
from mneme.model.experiment import Dim3


def test_static_hash_golden_values():
    assert static_hash("_Z6vecaddPKfS0_Pfi", b"ptx text") == "13945134898361943204"
    assert static_hash("k", b"") == "18350147709136054377"


def test_static_hash_follows_its_definition():
    digest = hashlib.sha256(b"mneme-static-v1\0" + b"kern\0" + b"code").digest()
    assert static_hash("kern", b"code") == str(int.from_bytes(digest[:8], "big"))
    assert static_hash("kern", "code") == static_hash("kern", b"code")


def test_dynamic_hash_golden_values():
    args = bytes(range(28))
    assert dynamic_hash("123", (4, 1, 1), (256, 1, 1), 0, args) == "754096302586027719"
    assert dynamic_hash("123", (4, 1, 1), (256, 1, 1), 0, args, occurrence=1) == "13867902561613136533"
    assert dynamic_hash("123", (4, 2, 3), (32, 4, 2), 1024, b"") == "8579206775390228668"


def test_dynamic_hash_follows_its_definition():
    payload = b"mneme-dynamic-v1\0" + b"77\0" + struct.pack("<7I", 2, 3, 4, 5, 6, 7, 8) + b"\x01\x02"
    expected = str(int.from_bytes(hashlib.sha256(payload).digest()[:8], "big"))
    assert dynamic_hash("77", Dim3(2, 3, 4), {"x": 5, "y": 6, "z": 7}, 8, b"\x01\x02") == expected
    with_occurrence = payload + struct.pack("<I", 3)
    assert dynamic_hash("77", (2, 3, 4), (5, 6, 7), 8, b"\x01\x02", 3) == str(
        int.from_bytes(hashlib.sha256(with_occurrence).digest()[:8], "big")
    )


def test_hashes_are_decimal_u64_and_distinguish_inputs():
    a = dynamic_hash("1", (1, 1, 1), (1, 1, 1), 0, b"a")
    b = dynamic_hash("1", (1, 1, 1), (1, 1, 1), 0, b"b")
    assert a != b and a.isdigit() and int(a) < 2**64


def test_dynamic_hash_rejects_out_of_range_values():
    with pytest.raises(ValueError):
        dynamic_hash("1", (2**32, 1, 1), (1, 1, 1), 0, b"")
    with pytest.raises(ValueError):
        dynamic_hash("1", (1, 1, 1), (1, 1, 1), -1, b"")


def test_launch_attributes_enter_the_dynamic_hash_only_when_present():
    payload = b"mneme-dynamic-v1\0" + b"77\0" + struct.pack("<7I", 2, 3, 4, 5, 6, 7, 8) + b"\x01\x02"
    attrs = struct.pack("<II3I", 4, 12, 2, 1, 1)  # database.attributes_key of a cluster dimension (2, 1, 1)
    with_attrs = payload + b"\0attributes\0" + struct.pack("<I", len(attrs)) + attrs + struct.pack("<I", 3)
    assert dynamic_hash("77", (2, 3, 4), (5, 6, 7), 8, b"\x01\x02", 3, attrs) == str(
        int.from_bytes(hashlib.sha256(with_attrs).digest()[:8], "big")
    )
    plain = dynamic_hash("77", (2, 3, 4), (5, 6, 7), 8, b"\x01\x02")
    assert dynamic_hash("77", (2, 3, 4), (5, 6, 7), 8, b"\x01\x02", 0, b"") == plain  # old ids stay
    assert dynamic_hash("77", (2, 3, 4), (5, 6, 7), 8, b"\x01\x02", 0, attrs) != plain


def test_an_attribute_keeps_its_key_whether_decoded_or_raw():
    from mneme.format.database import LaunchAttribute, attributes_key

    decoded = LaunchAttribute(4, "cluster_dim", (2, 1, 1))
    raw = LaunchAttribute(4, "raw", (), struct.pack("<3I", 2, 1, 1))
    assert attributes_key([decoded]) == attributes_key([raw]) == struct.pack("<II3I", 4, 12, 2, 1, 1)
    assert attributes_key([]) == b""
