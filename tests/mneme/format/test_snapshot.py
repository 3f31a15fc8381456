"""Snapshot files: round trip, validation, and every kind of corruption."""

import hashlib
import json
import os
import struct

import pytest

from mneme.errors import ArtifactError
from mneme.format.chunks import put_chunks
from mneme.format.policy import VerifyPolicy
from mneme.format.snapshot import (
    MAGIC,
    SNAPSHOT_VERSION,
    Region,
    Snapshot,
    build_snapshot,
    decode_snapshot,
    encode_snapshot,
    read_snapshot,
    write_snapshot,
)
from mneme.store import LocalStore

STATIC, DYNAMIC = "123", "456"


@pytest.fixture
def store(tmp_path):
    return LocalStore(tmp_path)


def make_snapshot(store, phase="prologue"):
    heap = os.urandom(5000)
    glob = b"\x01" * 64
    param = bytes(28)
    regions = [
        Region(0x7F0000001000, len(heap), "heap", "buf", tuple(put_chunks(store, heap, 2048)),
               VerifyPolicy("f32", "relative", 1e-6, "l2")),
        Region(0x7F0000000000, 64, "heap", "small", tuple(put_chunks(store, glob, 2048))),
        Region(0x500000, 64, "global", "g_table", tuple(put_chunks(store, glob, 2048))),
        Region(0, 28, "parameter", "params", tuple(put_chunks(store, param, 2048))),
    ]  # fmt: skip
    return build_snapshot(STATIC, DYNAMIC, phase, regions, chunk_size=2048), heap


def encode_header(header: dict, version: int = 1) -> bytes:
    body = json.dumps(header).encode()
    return MAGIC + struct.pack("<II", version, len(body)) + body + hashlib.sha256(body).digest()


def test_round_trip(store):
    snapshot, heap = make_snapshot(store)
    assert [r.kind for r in snapshot.regions] == ["heap", "heap", "global", "parameter"]
    assert [r.name for r in snapshot.regions] == ["small", "buf", "g_table", "params"]  # canonical order
    name, sha, size = write_snapshot(store, snapshot)
    assert name == "DeviceState.prologue.123.456.mneme"
    data = store.get(name)
    assert hashlib.sha256(data).hexdigest() == sha and len(data) == size
    back = read_snapshot(store, name, sha256=sha, size=size)
    assert back == snapshot
    assert back.region_named("buf").read(store) == heap
    assert back.region_named("buf").verify_policy.dtype == "f32"
    assert back.region_named("small").verify_policy.is_bitwise
    assert back.total_size == 5000 + 64 + 64 + 28


def test_prologue_and_epilogue_share_chunks(store):
    pro, _ = make_snapshot(store, "prologue")
    before = set(store.list("chunks/"))
    epi, _ = make_snapshot(store, "epilogue")  # new random heap, same small regions
    assert len(set(store.list("chunks/")) - before) == 3  # only the new 5000-byte region
    assert pro.region_named("small").chunks == epi.region_named("small").chunks
    assert pro.region_named("buf").chunks != epi.region_named("buf").chunks


def test_truncated_file(store):
    snapshot, _ = make_snapshot(store)
    data = encode_snapshot(snapshot)
    for cut in (0, 5, 16, len(data) // 2, len(data) - 1):
        with pytest.raises(ArtifactError, match="snap.mneme: truncated"):
            decode_snapshot(data[:cut], "snap.mneme")


def test_flipped_header_byte(store):
    snapshot, _ = make_snapshot(store)
    data = bytearray(encode_snapshot(snapshot))
    data[30] ^= 0x04
    with pytest.raises(ArtifactError, match="snap.mneme: header checksum mismatch"):
        decode_snapshot(bytes(data), "snap.mneme")


def test_bad_checksum(store):
    snapshot, _ = make_snapshot(store)
    data = bytearray(encode_snapshot(snapshot))
    data[-1] ^= 0xFF
    with pytest.raises(ArtifactError, match="checksum"):
        decode_snapshot(bytes(data), "s")


def test_bad_magic(store):
    snapshot, _ = make_snapshot(store)
    data = b"NOTMNEME" + encode_snapshot(snapshot)[8:]
    with pytest.raises(ArtifactError, match="s: not a mneme snapshot"):
        decode_snapshot(data, "s")


def test_newer_version_says_upgrade(store):
    snapshot, _ = make_snapshot(store)
    data = bytearray(encode_snapshot(snapshot))
    data[8:12] = struct.pack("<I", SNAPSHOT_VERSION + 1)
    with pytest.raises(ArtifactError, match=f"version {SNAPSHOT_VERSION + 1} is newer.*upgrade mneme"):
        decode_snapshot(bytes(data), "s")


def test_trailing_bytes(store):
    snapshot, _ = make_snapshot(store)
    with pytest.raises(ArtifactError, match="trailing"):
        decode_snapshot(encode_snapshot(snapshot) + b"x", "s")


def test_huge_header_length():
    with pytest.raises(ArtifactError, match="header length"):
        decode_snapshot(MAGIC + struct.pack("<II", 1, 2**32 - 1), "s")


def test_database_checksum_and_size_are_checked(store):
    snapshot, _ = make_snapshot(store)
    name, sha, size = write_snapshot(store, snapshot)
    with pytest.raises(ArtifactError, match=rf"{name} in .*: {size} bytes, the recording database says {size + 1}"):
        read_snapshot(store, name, sha256=sha, size=size + 1)
    with pytest.raises(ArtifactError, match=rf"{name}.*does not match the SHA-256"):
        read_snapshot(store, name, sha256="0" * 64)


def test_missing_snapshot(store):
    with pytest.raises(ArtifactError, match="DeviceState.prologue.1.2.mneme not found"):
        read_snapshot(store, "DeviceState.prologue.1.2.mneme")


def valid_header():
    sha = "ab" * 32
    return {
        "static_hash": "1",
        "dynamic_hash": "2",
        "phase": "epilogue",
        "chunk_size": 100,
        "regions": [
            {"base": 0, "size": 150, "kind": "heap", "name": "a", "chunks": [[sha, 100], [sha, 50]], "policy": None},
            {"base": 1000, "size": 10, "kind": "heap", "name": "b", "chunks": [[sha, 10]]},
        ],
    }


def test_valid_header_parses():
    snapshot = decode_snapshot(encode_header(valid_header()), "s")
    assert isinstance(snapshot, Snapshot) and len(snapshot.regions) == 2


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda h: h.pop("regions"), "missing key"),
        (lambda h: h.update(extra=1), "unknown key"),
        (lambda h: h.update(static_hash=1), "static_hash: expected a string"),
        (lambda h: h.update(dynamic_hash="x1"), "dynamic_hash: 'x1' is not a hash id"),
        (lambda h: h.update(static_hash=str(2**64)), "static_hash"),
        (lambda h: h.update(phase="middle"), "phase: expected one of"),
        (lambda h: h.update(chunk_size=0), "chunk_size"),
        (lambda h: h["regions"][0].update(kind="stack"), r"regions\[0\].kind"),
        (lambda h: h["regions"][0].update(size=151), "add up to 150, the region size is 151"),
        (lambda h: h["regions"][0].update(base=-1), r"regions\[0\].base: -1 is below"),
        (lambda h: h["regions"][0].update(base=2**64 - 100), "64-bit address space"),
        (lambda h: h["regions"][0].update(base=True), "expected an integer"),
        (lambda h: h["regions"][0]["chunks"].__setitem__(0, ["zz", 100]), "not a SHA-256"),
        (lambda h: h["regions"][0]["chunks"].__setitem__(0, ["ab" * 32]), r"expected \[sha256 hex, length\]"),
        (lambda h: h["regions"][0]["chunks"].__setitem__(0, ["ab" * 32, 101]), "above the maximum 100"),
        (lambda h: h["regions"][0]["chunks"].__setitem__(0, ["ab" * 32, 0]), "below the minimum 1"),
        (lambda h: h["regions"][0].update(chunks=[["ab" * 32, 50], ["ab" * 32, 100]]), "only the last chunk"),
        (lambda h: h["regions"][1].update(base=100), "overlap"),
        (lambda h: h["regions"][0].update(base=2000), "not sorted"),
        (lambda h: h["regions"][0].update(policy={"mode": "fuzzy"}), r"regions\[0\].policy.*mode"),
        (lambda h: h["regions"][0].update(policy={"mode": "absolute", "dtype": "f64"}), "not a multiple"),
        (lambda h: h["regions"][0].update(policy={"mode": "absolute", "threshold": -1}), "threshold"),
        (lambda h: h.update(regions={}), "regions: expected a list"),
    ],
)
def test_invalid_headers_name_the_problem(mutate, message):
    header = valid_header()
    mutate(header)
    with pytest.raises(ArtifactError, match=message) as info:
        decode_snapshot(encode_header(header), "DeviceState.epilogue.1.2.mneme")
    assert str(info.value).startswith("DeviceState.epilogue.1.2.mneme: ")


def test_invalid_json_and_utf8():
    for body in (b"{not json", b"\xff\xfe", b"[" * 100000):
        data = MAGIC + struct.pack("<II", 1, len(body)) + body + hashlib.sha256(body).digest()
        with pytest.raises(ArtifactError, match="s: header"):
            decode_snapshot(data, "s")


def test_global_and_heap_may_not_overlap_but_parameters_may():
    header = valid_header()
    header["regions"].append({"base": 1005, "size": 10, "kind": "global", "name": "g", "chunks": [["ab" * 32, 10]]})
    with pytest.raises(ArtifactError, match="overlap"):
        decode_snapshot(encode_header(header), "s")
    header["regions"][-1].update(kind="parameter")
    decode_snapshot(encode_header(header), "s")


def test_writer_refuses_invalid_snapshots(store):
    bad = Snapshot(STATIC, DYNAMIC, "prologue", (Region(0, 10, "heap", "x", ()),))
    with pytest.raises(ArtifactError, match="add up to 0, the region size is 10"):
        write_snapshot(store, bad)
    assert list(store.list()) == []


def test_chunk_errors_name_the_chunk_and_the_snapshot(store):
    snapshot, _ = make_snapshot(store)
    name, sha, size = write_snapshot(store, snapshot)
    back = read_snapshot(store, name)
    chunk = back.region_named("buf").chunks[1]
    store.delete(chunk.name)
    with pytest.raises(ArtifactError, match=rf"chunk {chunk.name} of region buf of snapshot {name} in .* is missing"):
        back.region_named("buf").read(store)
