"""PTX and cubins out of CUDA fatbins (the ``.nv_fatbin`` section nvcc puts in executables).

A fatbin is a sequence of containers (one per translation unit); each holds
entries of kind PTX (1) or ELF (2) for an architecture. nvcc 12.8+ compresses
entries with zstd by default (older ones with LZ4-like schemes we do not read:
such entries are skipped, and the cubin the driver loaded is still recorded).
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from typing import Iterator

from mneme.errors import ArtifactError

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX = 1
KIND_ELF = 2
_CONTAINER = struct.Struct("<IHHQ")   # magic, version, header size, payload size
_ENTRY = struct.Struct("<HHIQ")       # kind, version, header size, payload size
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_FLAG_COMPRESSED = 0x2000 | 0x8000


@dataclass(frozen=True)
class FatbinEntry:
    kind: int
    arch: int          # e.g. 90 for sm_90 / compute_90
    data: bytes        # decompressed payload (PTX text without trailing NULs, or ELF)

    @property
    def is_ptx(self) -> bool:
        return self.kind == KIND_PTX


def _decompress(payload: bytes, uncompressed_size: int) -> bytes | None:
    if payload.startswith(_ZSTD_MAGIC):
        import zstandard

        try:
            return zstandard.ZstdDecompressor().decompress(payload, max_output_size=max(uncompressed_size, 1) * 2)
        except zstandard.ZstdError:
            return None
    return None


def iter_entries(blob: bytes) -> Iterator[FatbinEntry]:
    """Every entry of every container in ``blob`` (a fatbin or a whole ``.nv_fatbin`` section)."""
    off = 0
    n = len(blob)
    while off + _CONTAINER.size <= n:
        magic, _version, header_size, payload_size = _CONTAINER.unpack_from(blob, off)
        if magic != FATBIN_MAGIC:
            off += 8  # containers are 8-byte aligned; skip padding
            continue
        pos, end = off + header_size, min(off + header_size + payload_size, n)
        while pos + _ENTRY.size <= end:
            kind, _ever, entry_header, size = _ENTRY.unpack_from(blob, pos)
            if entry_header < 64 or pos + entry_header + size > end:
                break
            header = blob[pos : pos + entry_header]
            payload = blob[pos + entry_header : pos + entry_header + size]
            arch = struct.unpack_from("<I", header, 28)[0]
            flags = struct.unpack_from("<Q", header, 40)[0] if entry_header >= 48 else 0
            uncompressed = struct.unpack_from("<Q", header, 64)[0] if entry_header >= 72 else 0
            if flags & _FLAG_COMPRESSED or payload.startswith(_ZSTD_MAGIC):
                data = _decompress(payload, uncompressed)
            else:
                data = payload
            if data is not None and kind in (KIND_PTX, KIND_ELF):
                if kind == KIND_PTX:
                    data = data.rstrip(b"\0")
                yield FatbinEntry(kind, arch, data)
            pos += entry_header + size
        off = off + header_size + payload_size
        off = (off + 7) // 8 * 8


def ptx_defines(ptx: bytes | str, kernel: str) -> bool:
    """Whether PTX text defines the entry ``kernel``."""
    text = ptx.decode("utf-8", "replace") if isinstance(ptx, bytes) else ptx
    return re.search(r"\.entry\s+" + re.escape(kernel) + r"\s*\(", text) is not None


def find_ptx(blob: bytes, kernel: str, arch: int | None = None) -> str | None:
    """The PTX (of the highest virtual arch not above ``arch``) that defines ``kernel``, from a fatbin blob."""
    best: FatbinEntry | None = None
    for e in iter_entries(blob):
        if not e.is_ptx or not ptx_defines(e.data, kernel):
            continue
        if arch is not None and e.arch > arch:
            continue
        if best is None or e.arch > best.arch:
            best = e
    return None if best is None else best.data.decode("utf-8", "replace")


def executable_fatbin(path: str | os.PathLike[str]) -> bytes | None:
    """The ``.nv_fatbin`` section of an executable or shared library, or None."""
    try:
        from mneme.llvm.elf import ElfError, read_section
    except ImportError:  # pragma: no cover - the LLVM tier ships with mneme
        return None
    try:
        return read_section(path, ".nv_fatbin")
    except (OSError, ElfError, ValueError):
        return None


def executable_bitcode(path: str | os.PathLike[str], kernel: str) -> bytes | None:
    """LLVM bitcode of ``kernel`` from the ``.mneme_bitcode`` section of an instrumented build, or None.

    The LLVM tier's reader matches the names nvcc and clang give the same kernel
    (they differ for kernels in anonymous namespaces).
    """
    try:
        from mneme.llvm.embedded import find_kernel_bitcode
    except ImportError:  # pragma: no cover
        return None
    try:
        return find_kernel_bitcode(os.fspath(path), kernel)
    except (OSError, ValueError, ArtifactError):
        return None
