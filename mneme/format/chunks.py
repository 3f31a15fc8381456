"""Content-addressed, compressed chunks: how snapshot bytes are stored.

A region is cut into fixed pieces (``DEFAULT_CHUNK_SIZE`` from the region
start, the last one shorter). Each piece is stored once, as the zstd frame of
its bytes under ``chunks/<2 hex>/<hash of the uncompressed bytes>`` (BLAKE3;
SHA-256 in version 1 recordings: :mod:`mneme.format.content_hash`): memory
that the epilogue shares with its prologue, or one instance with another, is
stored once, and every read is verified against the name.

Hashing and compression run on a thread pool: BLAKE3, hashlib, xxhash,
zstandard and file reads and writes release the GIL on large buffers, and
no piece is copied in Python (files are mapped, raw frames written from
views of them), so pieces are processed in parallel on every core. A writer's
:class:`~mneme.format.capture.ContentIndex` recognizes bytes it has stored
before without hashing them again, and pieces zstd would not shrink enough
to pay for its time are stored as raw frames (:mod:`mneme.format.frames`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, NamedTuple, Sequence, Union

import zstandard

from mneme.errors import ArtifactError
from mneme.format.capture import ContentIndex, PipelineStats, fingerprint
from mneme.format.content_hash import DEFAULT_CHUNK_HASH, SHA256, check_algorithm, chunk_digest, digest_matches
from mneme.format.frames import compressed_frame, frame_parts
from mneme.format.layout import chunk_name
from mneme.store.base import Store

DEFAULT_CHUNK_SIZE = 4 << 20
DEFAULT_LEVEL = 3
#: Refuse chunk sizes that would make a single object unreasonably large.
MAX_CHUNK_SIZE = 1 << 30


class ChunkRef(NamedTuple):
    """One stored piece: the hash (hex) of its uncompressed bytes, their length, and which hash it is.

    ``algorithm`` is ``"blake3"`` for the chunks of version 2 snapshots and
    ``"sha256"`` (the default, for pairs read from version 1) for version 1's.
    """

    digest: str
    length: int
    algorithm: str = SHA256

    @property
    def name(self) -> str:
        """Its object name in the store."""
        return chunk_name(self.digest)


def default_workers() -> int:
    """Threads of a storing pool: every CPU (hashing, compression and reads release the GIL), at most 32."""
    return max(1, min(32, os.cpu_count() or 1))


def default_read_workers() -> int:
    """Threads of a reading pool (replays: several may run at once on one host), at most 8."""
    return max(1, min(8, os.cpu_count() or 1))


_local = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "decompressor", None)
    if d is None:
        d = _local.decompressor = zstandard.ZstdDecompressor()
    return d


def compress_chunk(data: bytes | memoryview, level: int = DEFAULT_LEVEL) -> bytes:
    """The stored form of one piece: a zstd frame that records its content size (compressed)."""
    return compressed_frame(data, level)


def _read_buffer(size: int) -> bytearray:
    """This thread's buffer for pieces read from files (reused: no allocation, no page faults per piece)."""
    buf = getattr(_local, "read_buffer", None)
    if buf is None or len(buf) < size:
        buf = _local.read_buffer = bytearray(size)
    return buf


def _check_chunk_size(chunk_size: int) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or not 1 <= chunk_size <= MAX_CHUNK_SIZE:
        raise ValueError(f"chunk_size {chunk_size!r} must be an integer in 1..{MAX_CHUNK_SIZE}")


def _piece_bounds(size: int, chunk_size: int) -> list[tuple[int, int]]:
    return [(start, min(chunk_size, size - start)) for start in range(0, size, chunk_size)]


class FileSlice(NamedTuple):
    """Bytes of a local file: ``size`` bytes from ``offset`` (``None``: to the end of the file)."""

    path: str | os.PathLike[str]
    offset: int = 0
    size: int | None = None


#: What can be stored as chunks: bytes in memory, or a slice of a file (read piece by piece).
ChunkSource = Union[bytes, bytearray, memoryview, FileSlice]


def put_many(
    store: Store,
    sources: Sequence[ChunkSource],
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    level: int = DEFAULT_LEVEL,
    workers: int | None = None,
    index: ContentIndex | None = None,
    stats: PipelineStats | None = None,
    algorithm: str = DEFAULT_CHUNK_HASH,
) -> list[list[ChunkRef]]:
    """Store several sources as chunks, all pieces through one thread pool; refs per source, in order.

    A file slice is mapped and each piece is a view of it (``os.preadv`` into
    a buffer each thread reuses where a file cannot be mapped): nothing is
    copied in Python. A piece whose fingerprint ``index`` knows is named
    without hashing it again; within one call a digest is claimed by the
    first piece that has it; an existing object is never written again; a
    piece that zstd would not shrink enough is stored as a raw frame
    (:mod:`mneme.format.frames`) handed to ``store.put_parts`` as headers and
    views of the piece, which a local store writes with one ``writev``.
    Every stage of a piece runs without the GIL but the Python between
    them, so the pool's threads scale with the cores.

    Args:
        store: where the chunks go.
        sources: bytes in memory or :class:`FileSlice` s of local files.
        chunk_size: the piece size (the snapshot's ``chunk_size``).
        level: the zstd level for data that compresses well.
        workers: pool threads (default: every CPU, at most 32).
        index: fingerprints of pieces hashed before (a writer's; one per algorithm).
        stats: adds up what each stage cost.
        algorithm: the chunk hash, ``"blake3"`` (version 2) or ``"sha256"`` (version 1).

    Returns:
        The refs of each source's pieces, in order.
    """
    _check_chunk_size(chunk_size)
    check_algorithm(algorithm)
    stats = stats if stats is not None else PipelineStats()
    started = time.perf_counter()
    with contextlib.ExitStack() as files:
        pieces: list[tuple[int, Callable[[int, int], bytes | memoryview], int, int]] = []
        for source_index, source in enumerate(sources):
            read, size = _reader(source, files)
            pieces += [(source_index, read, start, length) for start, length in _piece_bounds(size, chunk_size)]
        claimed: set[str] = set()
        lock = threading.Lock()
        costs: list[dict[str, float]] = []  # one per piece; added up once all are stored (no lock per piece)
        clock = time.perf_counter

        def one(piece: tuple[int, Callable[[int, int], bytes | memoryview], int, int]) -> ChunkRef:
            # Every stage but the Python between them runs without the GIL: a view of the mapped file (no
            # copy), xxh3 and the chunk hash, the probe, and one writev of the frame (store.put_parts).
            _, read, start, length = piece
            t0 = clock()
            data = read(start, length)
            if len(data) != length:
                raise ArtifactError(f"short read: expected {length} bytes at offset {start}, got {len(data)}")
            t1 = clock()
            fp = fingerprint(data) if index is not None else b""
            digest = index.lookup(fp, length) if index is not None else None
            t2 = clock()
            stage = {"pieces": 1, "bytes": length, "read_s": t1 - t0, "fingerprint_s": t2 - t1}
            if digest is None:
                digest = chunk_digest(data, algorithm)
                if index is not None:
                    index.add(fp, length, digest)
                stage["hashed_bytes"], stage["hash_s"] = length, clock() - t2
            else:
                stage["known_bytes"] = length
            ref = ChunkRef(digest, length, algorithm)
            with lock:
                fresh = digest not in claimed
                claimed.add(digest)
            if fresh and not store.exists(ref.name):
                t3 = clock()
                parts, compressed = frame_parts(data, level)
                t4 = clock()
                store.put_parts(ref.name, parts)
                stage["compressed_bytes" if compressed else "raw_bytes"] = length
                stage["stored_bytes"] = sum(len(p) for p in parts)
                stage["compress_s"], stage["write_s"] = t4 - t3, clock() - t4
            else:
                stage["present_bytes"] = length
            costs.append(stage)
            return ref

        threads = min(workers or default_workers(), len(pieces))
        if threads <= 1:
            refs = [one(p) for p in pieces]
        else:
            with ThreadPoolExecutor(max_workers=threads) as pool:
                refs = list(pool.map(one, pieces))
    total: dict[str, float] = {}
    for stage in costs:
        for key, value in stage.items():
            total[key] = total.get(key, 0) + value
    stats.add(**total, wall_s=time.perf_counter() - started, workers=max(threads, 1))
    grouped: list[list[ChunkRef]] = [[] for _ in sources]
    for (source_index, _, _, _), ref in zip(pieces, refs):
        grouped[source_index].append(ref)
    return grouped


def _reader(source: ChunkSource, files: contextlib.ExitStack) -> tuple[Callable[[int, int], bytes | memoryview], int]:
    """A ``read(start, length)`` function over ``source`` and its size.

    A file slice is mapped (``mmap``, read-only, shared by the pool's threads): a piece is a view of the
    page cache, never copied into a buffer, and its pages come in as the fingerprint reads them. The
    file must not shrink while it is stored (the spool's stripe files never change once committed).
    Where a file cannot be mapped (or ``MNEME_AGENT_MMAP=0``), pieces are read with ``os.preadv`` into a
    buffer each thread reuses: the same CPU per byte on the development machine, one more copy through
    memory.
    """
    if not isinstance(source, FileSlice):
        view = memoryview(source).cast("B")
        return (lambda s, n: view[s : s + n]), len(view)
    try:
        fd = os.open(source.path, os.O_RDONLY)
    except OSError as exc:
        raise ArtifactError(f"cannot read region file {source.path}: {exc.strerror or exc}") from exc
    files.callback(os.close, fd)
    file_size = os.fstat(fd).st_size
    offset = source.offset
    size = file_size - offset if source.size is None else source.size
    if offset < 0 or size < 0 or offset + size > file_size:
        raise ArtifactError(
            f"region file {source.path} has {file_size} bytes; cannot read {size} bytes at offset {offset}"
        )
    mapped = _map(fd, offset, size, files) if os.environ.get("MNEME_AGENT_MMAP", "1") != "0" else None
    if mapped is not None:
        return (lambda s, n: mapped[s : s + n]), size

    def read(start: int, length: int) -> memoryview:
        view = memoryview(_read_buffer(length))[:length]
        got = 0
        while got < length:  # preadv may return less than asked (signals, huge reads)
            n = os.preadv(fd, [view[got:]], offset + start + got)
            if n <= 0:
                break
            got += n
        return view[:got]

    return read, size


def _map(fd: int, offset: int, size: int, files: contextlib.ExitStack) -> memoryview | None:
    """``size`` bytes of the open file from ``offset``, mapped read-only; None where it cannot be mapped."""
    if size == 0:
        return None
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    try:
        mapping = mmap.mmap(fd, offset - start + size, prot=mmap.PROT_READ, offset=start)
    except (OSError, ValueError):  # a file system without mmap, a special file
        return None
    view = memoryview(mapping)[offset - start : offset - start + size]

    def unmap() -> None:
        view.release()
        try:
            mapping.close()
        except BufferError:  # a piece's view is still held (an exception's traceback): unmapped when it goes
            pass

    files.callback(unmap)
    return view


def put_chunks(
    store: Store,
    data: bytes | bytearray | memoryview,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    level: int = DEFAULT_LEVEL,
    workers: int | None = None,
    algorithm: str = DEFAULT_CHUNK_HASH,
) -> list[ChunkRef]:
    """Store ``data`` as chunks (skipping those already stored) and return their refs in order.

    Args:
        store: the store.
        data: the bytes.
        chunk_size: bytes per chunk (the last may be shorter).
        level: zstd level for data that compresses well.
        workers: threads (None: one per CPU, at most 32).
        algorithm: ``blake3`` (snapshot version 2) or ``sha256`` (version 1).

    Returns:
        The ``ChunkRef`` of each chunk, in order.
    """
    return put_many(store, [data], chunk_size, level=level, workers=workers, algorithm=algorithm)[0]


def put_chunks_from_file(
    store: Store,
    path: str | os.PathLike[str],
    offset: int = 0,
    size: int | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    level: int = DEFAULT_LEVEL,
    workers: int | None = None,
    algorithm: str = DEFAULT_CHUNK_HASH,
) -> list[ChunkRef]:
    """Store ``size`` bytes of a file from ``offset`` as chunks (for raw region files of the recorder).

    The file is read piece by piece (``os.preadv``); it is never held whole in memory.

    Args:
        store: the store.
        path: the file.
        offset: where its bytes start.
        size: how many (None: to the end).
        chunk_size: bytes per chunk.
        level: zstd level for data that compresses well.
        workers: threads (None: one per CPU, at most 32).
        algorithm: ``blake3`` or ``sha256``.

    Returns:
        The ``ChunkRef`` of each chunk, in order.
    """
    return put_many(store, [FileSlice(path, offset, size)], chunk_size, level=level, workers=workers,
                    algorithm=algorithm)[0]


def _fetch_verified(store: Store, ref: ChunkRef, what: str) -> bytes:
    """Get, decompress and verify one chunk (``what`` names the snapshot in errors)."""
    name = ref.name
    try:
        blob = store.get(name)
    except ArtifactError:
        if store.exists(name):
            raise
        raise ArtifactError(f"chunk {name} of {what} is missing from {store.url}; the recording is incomplete") from None
    try:
        # Check the declared size first: a corrupt header must not make us allocate gigabytes.
        declared = zstandard.frame_content_size(blob)
        if declared not in (-1, ref.length):
            raise ArtifactError(
                f"chunk {name} of {what} in {store.url} declares {declared} bytes, expected {ref.length}"
            )
        piece = _decompressor().decompress(blob, max_output_size=max(ref.length, 1))
    except zstandard.ZstdError as exc:
        raise ArtifactError(f"chunk {name} of {what} in {store.url} is corrupt (zstd: {exc})") from None
    if len(piece) != ref.length:
        raise ArtifactError(
            f"chunk {name} of {what} in {store.url} holds {len(piece)} bytes, expected {ref.length}"
        )
    if not digest_matches(piece, ref.digest, ref.algorithm):
        raise ArtifactError(f"chunk {name} of {what} in {store.url} is corrupt: its content does not match its hash")
    return piece


def read_chunks_into(
    store: Store,
    refs: Sequence[ChunkRef],
    out: memoryview | bytearray,
    *,
    what: str = "snapshot",
    workers: int | None = None,
) -> None:
    """Fill ``out`` (exactly the total length of ``refs``) with the verified chunk contents.

    Args:
        store: the store.
        refs: the chunks, in order.
        out: the buffer to fill.
        what: what they hold, for error messages.
        workers: threads (None: one per CPU, at most 8).

    Raises:
        ArtifactError: a chunk is missing or does not match its name.
        ValueError: ``out`` has another length than the chunks.
    """
    view = memoryview(out).cast("B")
    total = sum(ref.length for ref in refs)
    if len(view) != total:
        raise ValueError(f"buffer holds {len(view)} bytes; the chunks of {what} hold {total}")
    offsets = []
    position = 0
    for ref in refs:
        offsets.append(position)
        position += ref.length

    def one(i: int) -> None:
        piece = _fetch_verified(store, refs[i], what)
        view[offsets[i] : offsets[i] + refs[i].length] = piece

    if len(refs) <= 1:
        for i in range(len(refs)):
            one(i)
        return
    with ThreadPoolExecutor(max_workers=min(workers or default_read_workers(), len(refs))) as pool:
        for _ in pool.map(one, range(len(refs))):
            pass


def read_chunks(store: Store, refs: Sequence[ChunkRef], *, what: str = "snapshot", workers: int | None = None) -> bytes:
    """The verified, concatenated contents of ``refs``.

    Args:
        store: the store.
        refs: the chunks, in order.
        what: what they hold, for error messages.
        workers: threads (None: one per CPU, at most 8).

    Returns:
        The bytes.

    Raises:
        ArtifactError: a chunk is missing or does not match its name.
    """
    out = bytearray(sum(ref.length for ref in refs))
    read_chunks_into(store, refs, out, what=what, workers=workers)
    return bytes(out)


def chunk_names(refs: Iterable[ChunkRef]) -> set[str]:
    """The object names ``refs`` use (for garbage collection and verification)."""
    return {ref.name for ref in refs}
