"""What a writer remembers between snapshots, and what storing them cost.

:class:`ContentIndex` maps the xxh3-128 fingerprint of a piece's bytes to the
digest that names its chunk. An iterative application's snapshots repeat
most of their bytes (a matrix read by every launch, inputs the kernel does not
write): a piece seen before is recognized at the fingerprint's speed (several
times the chunk hash's) and costs no chunk hash, no compression and no write. The chunk name stays the content hash of the bytes
(the format's guarantee for readers); the fingerprint is a 128-bit
non-cryptographic hash, trusted to tell *different* contents of one recording
session apart (accidental collisions: ~2^-128 per pair), never stored and
never read back. An index serves one chunk hash algorithm (its writer's).

:class:`PipelineStats` adds up, thread-safely, the bytes and thread-seconds of
each stage of :func:`mneme.format.chunks.put_many` (reading, fingerprinting,
hashing, compressing, writing), and what the record agent adds after it
(snapshot files, the commit): ``mneme record`` reports them per instance.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields

import xxhash


def fingerprint(data: bytes | bytearray | memoryview) -> bytes:
    """The xxh3-128 digest of ``data`` (16 bytes).

    Through the hasher object: its update releases the GIL, where ``xxh3_128_digest`` of python-xxhash
    3.x holds it for the whole hash (equal digests).
    """
    return xxhash.xxh3_128(data).digest()


class ContentIndex:
    """Fingerprint (and length) -> chunk digest (hex) of every piece a writer has hashed."""

    def __init__(self) -> None:
        self._digest: dict[tuple[bytes, int], str] = {}
        self._lock = threading.Lock()

    def lookup(self, fp: bytes, length: int) -> str | None:
        with self._lock:
            return self._digest.get((fp, length))

    def add(self, fp: bytes, length: int, digest: str) -> None:
        with self._lock:
            self._digest[(fp, length)] = digest

    def __len__(self) -> int:
        return len(self._digest)


@dataclass
class PipelineStats:
    """Bytes through each stage of storing chunks, and the thread-seconds spent there.

    ``pieces``/``bytes``: every piece offered; ``known_bytes``: pieces whose
    fingerprint was indexed (not hashed again); ``present_bytes``: pieces whose
    chunk was already stored (no compression, no write); ``hashed_*``: the
    chunk hash (BLAKE3, or SHA-256 for version 1); ``compressed_*``: pieces
    zstd compressed (``stored_bytes`` their frames); ``raw_*``: pieces stored
    as raw frames (the probe said zstd would not pay); ``wall_s``: elapsed time
    of the calls (stages overlap across threads); ``workers``: the pool's
    threads (the largest pool of the calls added up); ``unchanged_bytes``:
    snapshot bytes never copied off the device (named by their GPU digest),
    ``snapshot_s`` (writing the snapshot files) and ``commit_s`` (making the
    objects durable and committing the database), wall seconds: the record
    agent adds these.
    """

    pieces: int = 0
    bytes: int = 0
    read_s: float = 0.0
    fingerprint_s: float = 0.0
    known_bytes: int = 0
    hashed_bytes: int = 0
    hash_s: float = 0.0
    present_bytes: int = 0
    compressed_bytes: int = 0
    raw_bytes: int = 0
    stored_bytes: int = 0
    compress_s: float = 0.0
    write_s: float = 0.0
    wall_s: float = 0.0
    workers: int = 0
    unchanged_bytes: int = 0  # not offered at all: the recorder saw on the GPU that they were captured before
    snapshot_s: float = 0.0
    commit_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **values: float) -> None:
        """Add ``values`` to the fields they name (``workers``: keep the largest)."""
        with self._lock:
            for key, value in values.items():
                current = getattr(self, key)
                setattr(self, key, max(current, value) if key == "workers" else current + value)

    def merge(self, other: "PipelineStats") -> None:
        self.add(**other.as_dict())

    def as_dict(self) -> dict[str, float]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}

    def rates(self) -> dict[str, float]:
        """GB/s per stage (bytes / thread-seconds: per core) and overall (bytes / wall)."""

        def rate(nbytes: float, seconds: float) -> float:
            return nbytes / seconds / 1e9 if seconds > 0 else float("nan")

        return {
            "read_gb_s_per_thread": rate(self.bytes, self.read_s),
            "fingerprint_gb_s_per_thread": rate(self.bytes, self.fingerprint_s),
            "hash_gb_s_per_thread": rate(self.hashed_bytes, self.hash_s),
            "compress_gb_s_per_thread": rate(self.compressed_bytes + self.raw_bytes, self.compress_s),
            "write_gb_s_per_thread": rate(self.stored_bytes, self.write_s),
            "overall_gb_s": rate(self.bytes, self.wall_s),
            "new_data_gb_s": rate(self.hashed_bytes, self.wall_s),
            "commit_gb_s": rate(self.stored_bytes, self.commit_s),
        }
