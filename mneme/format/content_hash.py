"""The hash that names a chunk: BLAKE3 (snapshot version 2) or SHA-256 (version 1).

A chunk is stored under the 256-bit hash (64 lowercase hex digits) of its
uncompressed bytes. Version 2 snapshots name their chunks by BLAKE3: a tree
hash several times faster per core than SHA-256 (SIMD against the SHA
extensions), so hashing new snapshot data does not bound recording. Version 1 snapshots (recordings made before) name theirs by
SHA-256, and are still read and verified. A snapshot uses one algorithm for
all its chunks; equal bytes get equal names under one algorithm (dedupe),
and the two algorithms' names never collide.

Where only an object name is known (a chunk cache filled by name, say), a
chunk is accepted when its bytes match the name under either algorithm.
"""

from __future__ import annotations

import hashlib
from typing import Callable

from mneme.errors import NotAvailableError

SHA256 = "sha256"
BLAKE3 = "blake3"
#: Chunk hash algorithms, each with the snapshot format version that names chunks by it.
SNAPSHOT_VERSIONS = {SHA256: 1, BLAKE3: 2}
#: What writers use.
DEFAULT_CHUNK_HASH = BLAKE3

_blake3: Callable | None = None


def _blake3_hex(data: bytes | bytearray | memoryview) -> str:
    global _blake3
    if _blake3 is None:
        try:
            from blake3 import blake3
        except ImportError as exc:
            raise NotAvailableError(
                "BLAKE3 is not installed (pip install blake3): it names the chunks of snapshot format version 2"
            ) from exc
        _blake3 = blake3
    return _blake3(data).hexdigest()  # releases the GIL: pieces hash in parallel on a thread pool


def _sha256_hex(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


_HEX = {SHA256: _sha256_hex, BLAKE3: _blake3_hex}


def check_algorithm(algorithm: str) -> str:
    """Return ``algorithm`` if it is a chunk hash, else raise ValueError naming the known ones."""
    if algorithm not in _HEX:
        raise ValueError(f"unknown chunk hash {algorithm!r}; known: {', '.join(_HEX)}")
    return algorithm


def chunk_digest(data: bytes | bytearray | memoryview, algorithm: str = DEFAULT_CHUNK_HASH) -> str:
    """The hex digest that names a chunk of ``data`` under ``algorithm``.

    Args:
        data: the chunk's uncompressed bytes.
        algorithm: ``"blake3"`` (version 2) or ``"sha256"`` (version 1).

    Returns:
        64 lowercase hex digits.
    """
    return _HEX[check_algorithm(algorithm)](data)


def digest_matches(data: bytes | bytearray | memoryview, digest: str, algorithm: str | None = None) -> bool:
    """Whether ``data`` hashes to ``digest``.

    Args:
        data: the chunk's uncompressed bytes.
        digest: the hex digest its name (or snapshot) gives.
        algorithm: the algorithm the snapshot says; ``None`` (only a name is known): either.

    Returns:
        True when the bytes match.
    """
    if algorithm is not None:
        return chunk_digest(data, algorithm) == digest
    try:
        if _blake3_hex(data) == digest:
            return True
    except NotAvailableError:
        if _sha256_hex(data) == digest:
            return True
        raise  # a version 2 chunk cannot be checked here: say why rather than call it corrupt
    return _sha256_hex(data) == digest


__all__ = ["BLAKE3", "DEFAULT_CHUNK_HASH", "SHA256", "SNAPSHOT_VERSIONS", "check_algorithm", "chunk_digest",
           "digest_matches"]
