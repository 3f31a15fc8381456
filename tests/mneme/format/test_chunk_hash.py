"""Chunk names by BLAKE3 (snapshot version 2) beside SHA-256 (version 1): new recordings, old ones, mixed directories."""

from __future__ import annotations

import hashlib
import shutil
import struct
from pathlib import Path

import blake3
import pytest
import zstandard

from mneme.errors import ArtifactError
from mneme.format.chunks import ChunkRef, put_chunks, read_chunks
from mneme.format.content_hash import chunk_digest, digest_matches
from mneme.format.database import KernelParam, KernelSignature, find_databases, load_database
from mneme.format.hashing import static_hash
from mneme.format.snapshot import MAGIC, Region, Snapshot, encode_snapshot, read_snapshot
from mneme.format.verify import verify_recording
from mneme.format.writer import RecordingWriter, RegionSource, new_database
from mneme.store import LocalStore
from mneme.store.contents import check_chunk_blob, read_recording, verified_chunk

COMMITTED = Path(__file__).resolve().parents[2] / "data" / "recordings" / "vecadd"
PTX = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k(.param .u64 a)\n{ ret; }\n"


def write_instance(store, data: bytes, *, chunk_hash: str = "blake3", args: bytes = b"\0" * 8, chunk_size: int = 4096):
    """One instance of kernel ``k`` over one heap region holding ``data`` (before and after); the stored database."""
    writer = RecordingWriter(store, chunk_size=chunk_size, chunk_hash=chunk_hash)
    static = static_hash("k", PTX)
    code = writer.write_code(static, ptx=PTX)
    db = new_database(static, KernelSignature("k", "k", (KernelParam(0, 8, "pointer"),), 8), code)
    region = [RegionSource(0x7F0000000000, "heap", "a", data=data)]
    db, _ = writer.write_instance(db, grid=1, block=32, shared_mem=0, args=args, prologue=region, epilogue=region)
    return db


def snapshot_version(store, name: str) -> int:
    return struct.unpack_from("<I", store.get(name), len(MAGIC))[0]


def test_new_recordings_name_chunks_by_blake3_in_version_2_snapshots(tmp_path):
    store = LocalStore(tmp_path)
    data = bytes(range(256)) * 40  # 10240 bytes: three chunks of 4096
    db = write_instance(store, data)
    (inst,) = db.instances.values()
    assert snapshot_version(store, inst.prologue.path) == 2
    snapshot = read_snapshot(store, inst.prologue.path)
    refs = snapshot.regions[0].chunks
    assert [r.algorithm for r in refs] == ["blake3"] * 3
    assert refs[0].digest == blake3.blake3(data[:4096]).hexdigest()
    assert refs[0].name == f"chunks/{refs[0].digest[:2]}/{refs[0].digest}"
    assert snapshot.regions[0].read(store) == data
    assert verify_recording(store, db.name).ok


def test_the_committed_version_1_recording_still_loads_and_verifies():
    store = LocalStore(COMMITTED)
    (name,) = find_databases(store)
    report = verify_recording(store, name)  # deep: SHA-256 of every chunk
    assert report.ok, report.problems
    db = load_database(store, name)
    (inst,) = db.instances.values()
    assert snapshot_version(store, inst.prologue.path) == 1
    snapshot = read_snapshot(store, inst.prologue.path)
    ref = snapshot.regions[0].chunks[0]
    assert ref.algorithm == "sha256"
    data = read_chunks(store, [ref])
    assert hashlib.sha256(data).hexdigest() == ref.digest
    assert verified_chunk(store, ref)  # what `mneme pull` checks
    contents = read_recording(store, name)  # what `mneme ls` reads
    assert {c.algorithm for c in contents.chunks} == {"sha256"}


def test_a_version_2_instance_recorded_into_a_version_1_directory_keeps_both_readable(tmp_path):
    directory = tmp_path / "rec"
    shutil.copytree(COMMITTED, directory)
    store = LocalStore(directory)
    (name,) = find_databases(store)
    old = load_database(store, name)
    writer = RecordingWriter(store)
    (old_id, old_inst) = next(iter(old.instances.items()))
    prologue = read_snapshot(store, old_inst.prologue.path)
    regions = [RegionSource(r.base, r.kind, r.name, data=r.read(store), policy=r.policy) for r in prologue.regions]
    # The same launch again with other arguments: a second instance, in version 2.
    merged, new_inst = writer.write_instance(old, grid=old_inst.grid, block=old_inst.block, shared_mem=old_inst.shared_mem,
                                             args=bytes(len(old_inst.args)), prologue=regions, epilogue=regions)
    assert set(merged.instances) == {old_id, new_inst.dynamic_hash}
    assert snapshot_version(store, old_inst.prologue.path) == 1 and snapshot_version(store, new_inst.prologue.path) == 2
    report = verify_recording(store, name)
    assert report.ok, report.problems
    contents = read_recording(store, name)
    assert {c.algorithm for c in contents.chunks} == {"sha256", "blake3"}
    # Same bytes, two names: one per algorithm (dedupe holds within each).
    assert read_snapshot(store, new_inst.prologue.path).regions[0].read(store) == prologue.regions[0].read(store)


def test_equal_bytes_get_equal_names_across_recordings_and_are_stored_once(tmp_path):
    data = bytes(range(256)) * 64
    a, b = LocalStore(tmp_path / "a"), LocalStore(tmp_path / "b")
    refs_a, refs_b = put_chunks(a, data, 4096), put_chunks(b, data, 4096)
    assert refs_a == refs_b  # the name depends on the bytes alone
    assert len({r.name for r in refs_a}) == 1  # 16 equal pieces, one object
    assert sum(1 for _ in a.list("chunks/")) == 1


def test_a_version_1_writer_writes_what_version_1_wrote(tmp_path):
    store = LocalStore(tmp_path)
    data = bytes(range(256)) * 20
    db = write_instance(store, data, chunk_hash="sha256")
    (inst,) = db.instances.values()
    assert snapshot_version(store, inst.prologue.path) == 1
    (ref,) = read_snapshot(store, inst.prologue.path).regions[0].chunks[:1]
    assert ref == ChunkRef(hashlib.sha256(data[:4096]).hexdigest(), 4096, "sha256")
    assert verify_recording(store, db.name).ok


def test_a_snapshot_names_its_chunks_by_one_algorithm():
    blake = ChunkRef(chunk_digest(b"x", "blake3"), 1, "blake3")
    sha = ChunkRef(chunk_digest(b"y", "sha256"), 1, "sha256")
    mixed = Snapshot("1", "2", "prologue", (Region(0x1000, 1, "heap", "a", (blake,)), Region(0x2000, 1, "heap", "b", (sha,))), 4096)
    with pytest.raises(ArtifactError, match="mixes chunk hashes"):
        encode_snapshot(mixed)


@pytest.mark.parametrize("algorithm", ["blake3", "sha256"])
def test_corrupt_chunks_are_caught_under_either_algorithm(tmp_path, algorithm):
    store = LocalStore(tmp_path)
    (ref,) = put_chunks(store, b"payload " * 100, algorithm=algorithm)
    path = store.local_path(ref.name)
    path.write_bytes(zstandard.ZstdCompressor().compress(b"PAYLOAD " * 100))
    with pytest.raises(ArtifactError, match="does not match its hash"):
        read_chunks(store, [ref])
    with pytest.raises(ArtifactError, match="does not match its name"):
        verified_chunk(store, ref)


def test_a_chunk_known_only_by_name_is_checked_against_both_algorithms(tmp_path):
    data = b"chunk bytes" * 50
    for algorithm in ("blake3", "sha256"):
        digest = chunk_digest(data, algorithm)
        blob = zstandard.ZstdCompressor().compress(data)
        check_chunk_blob(blob, digest, "chunk")  # no algorithm: what a cache filled by name knows
        assert digest_matches(data, digest) and not digest_matches(data + b"!", digest)
        with pytest.raises(ArtifactError, match="does not match its name"):
            check_chunk_blob(zstandard.ZstdCompressor().compress(data + b"!"), digest, "chunk")
    # The algorithm a snapshot gives is the only one accepted then.
    assert not digest_matches(data, chunk_digest(data, "sha256"), "blake3")
