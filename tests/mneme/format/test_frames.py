"""Stored chunk frames: raw-block frames where compression would not pay, readable by any zstd decoder."""

import os

import blake3
import numpy as np
import pytest
import zstandard

from mneme.format.capture import ContentIndex, PipelineStats
from mneme.format.chunks import put_many, read_chunks
from mneme.format.frames import MAX_BLOCK, frame_parts, raw_frame, raw_frame_parts, stored_frame
from mneme.store import LocalStore


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65791, 65792, MAX_BLOCK, MAX_BLOCK + 1, 3 * MAX_BLOCK, (1 << 20) + 7])
def test_raw_frame_is_a_zstd_frame_of_the_bytes(size):
    data = os.urandom(size)
    frame = raw_frame(data)
    assert zstandard.frame_content_size(frame) == size
    assert zstandard.ZstdDecompressor().decompress(frame, max_output_size=max(size, 1)) == data
    # Streaming readers (no declared-size shortcut) read it too.
    assert zstandard.ZstdDecompressor().stream_reader(frame).read() == data
    # Written as parts: the same bytes, the piece's blocks views of it (nothing copied).
    parts = raw_frame_parts(data)
    assert b"".join(parts) == frame
    assert all(p.obj is data for p in parts if isinstance(p, memoryview)) and sum(map(len, parts)) == len(frame)


def test_frame_parts_decide_as_stored_frame():
    smooth_doubles = np.sin(np.arange(1 << 19) * 1e-3).tobytes()
    indices = (np.arange(1 << 20, dtype=np.int32) // 27).tobytes()
    for data in (os.urandom(1 << 20), smooth_doubles, indices, bytes(1 << 20)):
        parts, compressed = frame_parts(data, 3)
        frame, compressed_too = stored_frame(data, 3)
        assert compressed == compressed_too and b"".join(parts) == bytes(frame)


def test_probe_compresses_what_shrinks_and_stores_the_rest_raw():
    smooth_doubles = np.sin(np.arange(1 << 19) * 1e-3).tobytes()  # zstd keeps ~95% of these
    indices = (np.arange(1 << 20, dtype=np.int32) // 27).tobytes()
    assert stored_frame(os.urandom(1 << 20), 3)[1] is False
    assert stored_frame(smooth_doubles, 3)[1] is False
    assert stored_frame(indices, 3)[1] is True
    assert stored_frame(bytes(1 << 20), 3)[1] is True


def test_repeated_bytes_are_named_from_the_index_without_hashing(tmp_path):
    store, index = LocalStore(tmp_path), ContentIndex()
    a, b = os.urandom(3 << 20), bytes(1 << 20)
    first, second = PipelineStats(), PipelineStats()
    (refs_a, refs_b) = put_many(store, [a, b], 1 << 20, index=index, stats=first)
    assert first.hashed_bytes == 4 << 20 and first.known_bytes == 0
    assert first.raw_bytes == 3 << 20 and first.compressed_bytes == 1 << 20
    (again,) = put_many(store, [b + a], 1 << 20, index=index, stats=second)
    assert second.hashed_bytes == 0 and second.known_bytes == 4 << 20 and second.present_bytes == 4 << 20
    assert again == refs_b + refs_a
    assert [r.digest for r in again] == [blake3.blake3((b + a)[i : i + (1 << 20)]).hexdigest() for i in range(0, 4 << 20, 1 << 20)]
    assert read_chunks(store, again) == b + a  # raw frames verify like any other


def test_an_indexed_chunk_missing_from_the_store_is_written_again(tmp_path):
    store, index = LocalStore(tmp_path), ContentIndex()
    data = os.urandom(1 << 20)
    (refs,) = put_many(store, [data], 1 << 20, index=index)
    store.delete(refs[0].name)  # as the S3 uploader prunes staged chunks it has sent
    (again,) = put_many(store, [data], 1 << 20, index=index)
    assert again == refs and read_chunks(store, again) == data


def test_data_that_shrinks_only_somewhat_is_compressed_at_the_fast_level():
    n = 1024
    s = 6.2831853 / n
    x = np.arange(n, dtype=np.float32)
    field = (np.sin(s * x)[None, :] * np.cos(s * x)[:, None]).astype(np.float32).tobytes()  # a stencil's plane
    frame, compressed = stored_frame(field, 3)
    assert compressed and len(frame) < len(field)
    assert frame == zstandard.ZstdCompressor(level=1, write_content_size=True).compress(field)
    assert zstandard.ZstdDecompressor().decompress(frame) == field
