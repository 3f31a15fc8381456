"""The stored form of a chunk: one zstd frame, compressed only where compression pays.

Device memory of real applications is often floating-point data that zstd
shrinks by a few percent, at a small fraction of the hash's and the copy's
rates. A short probe (three 32 KiB
samples at level 1) decides: a piece whose samples do not shrink below
``RAW_RATIO`` is stored as a zstd frame of *raw blocks* (RFC 8878, section
3.1.1.2: block type 0), which every zstd decoder reads like any other frame
(content size declared, so readers check it first); a writer gets it as
parts (:func:`frame_parts`: the headers and views of the piece, written with
one ``writev``), never copied into a buffer. Between the two, data that
shrinks only somewhat (smooth floating-point fields: level 3 saves a little
more than level 1, at several times the CPU) is compressed at level
``FAST_LEVEL``; the requested level is kept for data that compresses well
(integers, zeros, repeated values), which zstd handles fast at any level.
Nothing in the format changes: a chunk is still one zstd frame of its bytes.
"""

from __future__ import annotations

import functools
import struct
import threading

import zstandard

#: Level of the probe; cheap, and its ratio tracks level 3's closely.
PROBE_LEVEL = 1
PROBE_SAMPLE = 32 << 10
#: Store raw when the probe's samples keep more than this fraction of their size.
RAW_RATIO = 0.85
#: Below this probe ratio the requested level is used; between it and RAW_RATIO, FAST_LEVEL.
WELL_COMPRESSIBLE_RATIO = 0.5
FAST_LEVEL = 1
#: Largest block of a frame (zstd's Block_Maximum_Size).
MAX_BLOCK = 128 << 10

_MAGIC = struct.pack("<I", 0xFD2FB528)
_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    """A per-thread compressor (ZstdCompressor objects are not thread-safe)."""
    cache = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cache[level]


def compressed_frame(data: bytes | bytearray | memoryview, level: int) -> bytes:
    """A zstd frame of ``data`` compressed at ``level`` (its content size recorded)."""
    return _compressor(level).compress(data)


def _frame_header(size: int) -> bytes:
    """Single-segment frame header declaring ``size`` content bytes, no checksum, no dictionary."""
    if size < 256:
        return _MAGIC + bytes([0x20, size])  # FCS flag 0 (1 byte) + single segment
    if size < 65536 + 256:
        return _MAGIC + bytes([0x60]) + struct.pack("<H", size - 256)  # FCS flag 1: 2 bytes, offset by 256
    if size < 1 << 32:
        return _MAGIC + bytes([0xA0]) + struct.pack("<I", size)  # FCS flag 2: 4 bytes
    return _MAGIC + bytes([0xE0]) + struct.pack("<Q", size)  # FCS flag 3: 8 bytes


def raw_frame_size(size: int) -> int:
    """The length of the raw frame of ``size`` bytes."""
    return len(_frame_header(size)) + 3 * max(1, -(-size // MAX_BLOCK)) + size


@functools.lru_cache(maxsize=64)
def _raw_headers(size: int) -> tuple[bytes, tuple[bytes, ...]]:
    """The frame header and the 3-byte block headers of the raw frame of ``size`` bytes (the same for every piece)."""
    blocks = [struct.pack("<I", 1)[:3]] if size == 0 else []  # one empty last raw block
    for start in range(0, size, MAX_BLOCK):
        length = min(MAX_BLOCK, size - start)
        last = start + length == size
        blocks.append(struct.pack("<I", (length << 3) | int(last))[:3])  # block type 0 (raw) in bits 1-2
    return _frame_header(size), tuple(blocks)


def raw_frame_parts(data: bytes | bytearray | memoryview) -> list[bytes | memoryview]:
    """The raw frame of ``data`` as the buffers to write one after the other: headers, and views of ``data``.

    Nothing is copied: a store writes the parts with one ``writev`` (``Store.put_parts``), so the kernel
    copies each block straight from ``data`` (a piece of the mapped spool file) into the chunk file.
    """
    view = memoryview(data).cast("B")
    header, blocks = _raw_headers(len(view))
    parts: list[bytes | memoryview] = [header]
    for k, block in enumerate(blocks):
        parts.append(block)
        if len(view):
            parts.append(view[k * MAX_BLOCK : (k + 1) * MAX_BLOCK])
    return parts


def raw_frame(data: bytes | bytearray | memoryview, out: bytearray | None = None) -> bytes | memoryview:
    """A zstd frame holding ``data`` uncompressed (raw blocks of at most 128 KiB), in one buffer.

    Args:
        data: the piece.
        out: a buffer of at least :func:`raw_frame_size` bytes to build the frame in; None: a new ``bytes``.

    Returns:
        The frame: ``bytes``, or a view of ``out``, valid until ``out`` is reused.
    """
    parts = raw_frame_parts(data)
    if out is None:
        return b"".join(parts)
    target = memoryview(out)
    position = 0
    for part in parts:
        target[position : position + len(part)] = part
        position += len(part)
    return target[:position]


def probe_ratio(data: bytes | bytearray | memoryview) -> float:
    """What samples from the start, middle and end of ``data`` keep of their size at level 1 (1.0: nothing saved)."""
    view = memoryview(data).cast("B")
    if len(view) <= 3 * PROBE_SAMPLE:
        samples = [view]
    else:
        mid = (len(view) - PROBE_SAMPLE) // 2
        samples = [view[:PROBE_SAMPLE], view[mid : mid + PROBE_SAMPLE], view[-PROBE_SAMPLE:]]
    total = sum(len(s) for s in samples)
    if total == 0:
        return 1.0
    probe = _compressor(PROBE_LEVEL)
    return sum(len(probe.compress(s)) for s in samples) / total


def frame_parts(data: bytes | bytearray | memoryview, level: int) -> tuple[list[bytes | memoryview], bool]:
    """The frame to store for ``data``, as buffers to write in order, and whether it was compressed.

    Raw (the probe says zstd would keep more than ``RAW_RATIO``): :func:`raw_frame_parts`, views of
    ``data`` without a copy. Else one compressed frame (``level``, or ``FAST_LEVEL`` for data that
    shrinks only somewhat).
    """
    ratio = probe_ratio(data)
    if ratio >= RAW_RATIO:
        return raw_frame_parts(data), False
    return [compressed_frame(data, level if ratio < WELL_COMPRESSIBLE_RATIO else min(level, FAST_LEVEL))], True


def stored_frame(
    data: bytes | bytearray | memoryview, level: int, out: bytearray | None = None
) -> tuple[bytes | memoryview, bool]:
    """The frame to store for ``data`` in one buffer and whether it was compressed (False: raw blocks, built in ``out`` if given)."""
    ratio = probe_ratio(data)
    if ratio >= RAW_RATIO:
        return raw_frame(data, out), False
    return compressed_frame(data, level if ratio < WELL_COMPRESSIBLE_RATIO else min(level, FAST_LEVEL)), True
