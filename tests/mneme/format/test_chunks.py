"""Chunk storage: split, dedupe, compress, verify."""

import os

import blake3
import pytest
import zstandard

from mneme.errors import ArtifactError
from mneme.format.chunks import (
    ChunkRef,
    compress_chunk,
    put_chunks,
    put_chunks_from_file,
    read_chunks,
    read_chunks_into,
)
from mneme.store import LocalStore


class CountingStore(LocalStore):
    """Counts puts (to check deduplication); plumbing only, the storage is real."""

    def __init__(self, root):
        super().__init__(root)
        self.puts = []

    def put_parts(self, name, parts):  # LocalStore.put goes through it too
        self.puts.append(name)
        super().put_parts(name, parts)


@pytest.fixture
def store(tmp_path):
    return CountingStore(tmp_path)


def test_split_hash_and_round_trip(store):
    data = os.urandom(10_000)
    refs = put_chunks(store, data, chunk_size=4096)
    assert [r.length for r in refs] == [4096, 4096, 1808]
    assert refs[0] == ChunkRef(blake3.blake3(data[:4096]).hexdigest(), 4096, "blake3")
    assert refs[0].name == f"chunks/{refs[0].digest[:2]}/{refs[0].digest}"
    assert read_chunks(store, refs) == data
    out = bytearray(len(data))
    read_chunks_into(store, refs, memoryview(out))
    assert out == data


def test_stored_form_is_a_zstd_frame_with_content_size(store):
    refs = put_chunks(store, b"abc" * 1000)
    blob = store.get(refs[0].name)
    assert zstandard.frame_content_size(blob) == 3000 and len(blob) < 100


def test_empty_data_has_no_chunks(store):
    assert put_chunks(store, b"") == []
    assert read_chunks(store, []) == b""


def test_same_data_is_stored_once(store):
    piece = os.urandom(1000)
    refs = put_chunks(store, piece * 8, chunk_size=1000)
    assert len(set(refs)) == 1 and len(store.puts) == 1
    again = put_chunks(store, piece * 3, chunk_size=1000)
    assert again == refs[:3] and len(store.puts) == 1
    assert len(list(store.list("chunks/"))) == 1


def test_from_file_matches_in_memory(store, tmp_path):
    data = os.urandom(50_000)
    path = tmp_path / "raw.bin"
    path.write_bytes(b"HEAD" + data + b"TAIL")
    refs = put_chunks_from_file(store, path, offset=4, size=len(data), chunk_size=8192)
    assert refs == put_chunks(store, data, chunk_size=8192)
    assert read_chunks(store, refs) == data
    assert put_chunks_from_file(store, path, chunk_size=8192) == put_chunks(store, b"HEAD" + data + b"TAIL", 8192)
    with pytest.raises(ArtifactError, match="cannot read"):
        put_chunks_from_file(store, path, offset=10, size=len(data))
    with pytest.raises(ArtifactError, match="cannot read region file"):
        put_chunks_from_file(store, tmp_path / "missing.bin")


def test_file_slices_are_mapped_at_any_offset_and_read_where_they_cannot_be(store, tmp_path, monkeypatch):
    """Pieces of a file slice are views of the mapped file (any offset, not only page-aligned ones); where
    mmap fails they are read with preadv; both store the same chunks as the bytes in memory."""
    import mneme.format.chunks as chunks

    data = os.urandom(3 * 8192 + 100)
    path = tmp_path / "stripe.bin"
    path.write_bytes(os.urandom(70_001) + data)
    expected = put_chunks(store, data, chunk_size=8192)
    assert put_chunks_from_file(store, path, offset=70_001, size=len(data), chunk_size=8192, workers=2) == expected

    def no_mmap(*args, **kwargs):
        raise OSError("no mmap here")

    monkeypatch.setattr(chunks.mmap, "mmap", no_mmap)
    assert put_chunks_from_file(store, path, offset=70_001, size=len(data), chunk_size=8192, workers=2) == expected
    assert read_chunks(store, expected) == data


def test_missing_chunk_is_named(store):
    refs = put_chunks(store, os.urandom(3000), chunk_size=1000)
    store.delete(refs[1].name)
    with pytest.raises(ArtifactError, match=rf"chunk {refs[1].name} of snapshot X is missing"):
        read_chunks(store, refs, what="snapshot X")


def test_corrupt_chunk_content_is_detected(store):
    refs = put_chunks(store, os.urandom(3000), chunk_size=1000)
    store.put(refs[2].name, compress_chunk(os.urandom(1000)))
    with pytest.raises(ArtifactError, match=rf"chunk {refs[2].name} of snap.*does not match its hash"):
        read_chunks(store, refs, what="snap")


def test_garbage_chunk_is_detected(store):
    refs = put_chunks(store, os.urandom(1000))
    store.put(refs[0].name, b"not zstd at all")
    with pytest.raises(ArtifactError, match="corrupt"):
        read_chunks(store, refs)


def test_chunk_of_wrong_size_is_detected(store):
    refs = put_chunks(store, os.urandom(1000))
    store.put(refs[0].name, compress_chunk(os.urandom(5000)))
    with pytest.raises(ArtifactError, match="declares 5000 bytes, expected 1000"):
        read_chunks(store, refs)
    store.put(refs[0].name, zstandard.ZstdCompressor(write_content_size=False).compress(os.urandom(999)))
    with pytest.raises(ArtifactError, match="holds 999 bytes, expected 1000"):
        read_chunks(store, refs)


def test_truncated_chunk_is_detected(store):
    refs = put_chunks(store, os.urandom(1000))
    blob = store.get(refs[0].name)
    store.put(refs[0].name, blob[: len(blob) // 2])
    with pytest.raises(ArtifactError, match="corrupt"):
        read_chunks(store, refs)


def test_buffer_size_must_match(store):
    refs = put_chunks(store, b"x" * 10)
    with pytest.raises(ValueError):
        read_chunks_into(store, refs, bytearray(11))


def test_bad_chunk_size_is_rejected(store):
    for bad in (0, -1, 1.5, 2**31):
        with pytest.raises(ValueError):
            put_chunks(store, b"x", chunk_size=bad)


def test_put_many_mixes_memory_and_files_and_dedupes_across_sources(store, tmp_path):
    from mneme.format.chunks import FileSlice, put_many

    data = os.urandom(3000)
    path = tmp_path / "raw"
    path.write_bytes(b"xx" + data)
    refs = put_many(store, [data, FileSlice(path, 2), b"", memoryview(data)[:1000]], chunk_size=1000)
    assert refs[0] == refs[1] and refs[2] == [] and refs[3] == refs[0][:1]
    assert len(store.puts) == 3
    assert [read_chunks(store, r) for r in refs] == [data, data, b"", data[:1000]]
