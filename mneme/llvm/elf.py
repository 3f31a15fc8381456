"""Read one named section out of an ELF64 file without loading the whole file.

Standard library only (the compiler wrappers use it too). Executables of real
applications can be hundreds of megabytes; only the ELF header, the section
header table, the section-name string table and the wanted section are read.
"""

from __future__ import annotations

import io
import os
import struct
from typing import BinaryIO

_ELF_MAGIC = b"\x7fELF"
_ELFCLASS64 = 2
_ELFDATA2LSB = 1
_SHT_NOBITS = 8


class ElfError(ValueError):
    """The file is not an ELF64 little-endian file, or its section table is damaged."""


def _read_exact(f: BinaryIO, offset: int, size: int, what: str) -> bytes:
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise ElfError(f"truncated ELF file: cannot read the {what} ({size} bytes at offset {offset})")
    return data


def _sections(f: BinaryIO) -> dict[str, tuple[int, int, int]]:
    """Map section name -> (type, file offset, size)."""
    ident = _read_exact(f, 0, 64, "ELF header")
    if ident[:4] != _ELF_MAGIC:
        raise ElfError("not an ELF file (no \\x7fELF magic)")
    if ident[4] != _ELFCLASS64 or ident[5] != _ELFDATA2LSB:
        raise ElfError("only 64-bit little-endian ELF files are supported")
    (shoff,) = struct.unpack_from("<Q", ident, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ident, 0x3A)
    if shoff == 0 or shnum == 0:
        return {}
    if shentsize < 64:
        raise ElfError(f"section header entries of {shentsize} bytes are too small")
    table = _read_exact(f, shoff, shentsize * shnum, "section header table")
    entries = []
    for i in range(shnum):
        name, sh_type, _flags, _addr, offset, size = struct.unpack_from("<IIQQQQ", table, i * shentsize)
        entries.append((name, sh_type, offset, size))
    if shstrndx >= shnum:
        raise ElfError(f"section name table index {shstrndx} is out of range")
    _, _, str_off, str_size = entries[shstrndx]
    strtab = _read_exact(f, str_off, str_size, "section name table")
    out: dict[str, tuple[int, int, int]] = {}
    for name_off, sh_type, offset, size in entries:
        end = strtab.find(b"\0", name_off)
        name = strtab[name_off : end if end >= 0 else None].decode("utf-8", "replace")
        out.setdefault(name, (sh_type, offset, size))
    return out


def read_section(source: str | os.PathLike | bytes | bytearray | memoryview, name: str) -> bytes | None:
    """The contents of section ``name`` of an ELF64 file (path or bytes), or None if it has none."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _read_from(io.BytesIO(bytes(source)), name)
    with open(source, "rb") as f:
        return _read_from(f, name)


def _read_from(f: BinaryIO, name: str) -> bytes | None:
    found = _sections(f).get(name)
    if found is None:
        return None
    sh_type, offset, size = found
    if sh_type == _SHT_NOBITS:
        return b""
    return _read_exact(f, offset, size, f"section {name}")


def section_names(source: str | os.PathLike | bytes) -> list[str]:
    """Names of all sections (for error messages and tests)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return list(_sections(io.BytesIO(bytes(source))))
    with open(source, "rb") as f:
        return list(_sections(f))
