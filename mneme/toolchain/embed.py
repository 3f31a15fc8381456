"""Put bitcode records into the ``.mneme_bitcode`` section of an object, library or executable.

Records already in the file are kept (duplicates dropped), so embedding is
idempotent and the wrapper and ``add_mneme()`` can both run on one target.
objcopy (binutils, or llvm-objcopy) adds a non-allocated section: it is not
loaded at run time and changes nothing the program executes. Standard library only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from mneme.llvm.elf import ElfError, read_section
from mneme.llvm.section import SECTION_NAME, BitcodeRecord, decode_records, encode_records


class EmbedError(RuntimeError):
    """The records could not be written into the file."""


def find_objcopy() -> str:
    for name in (os.environ.get("MNEME_OBJCOPY"), "objcopy", "llvm-objcopy", "llvm-objcopy-19"):
        path = name and shutil.which(name)
        if path:
            return path
    raise EmbedError("no objcopy found (install binutils, or set MNEME_OBJCOPY)")


def embed_records(path: str, records: list[BitcodeRecord]) -> int:
    """Merge ``records`` into the section of ELF file ``path``; returns the number of records it holds."""
    try:
        existing_bytes = read_section(path, SECTION_NAME)
    except (ElfError, OSError) as exc:
        raise EmbedError(f"{path}: {exc}") from None
    existing = decode_records(existing_bytes) if existing_bytes else []
    merged = existing + list(records)
    data = encode_records(merged)
    if existing_bytes is not None and data == existing_bytes:
        return len(existing)
    option = "--update-section" if existing_bytes is not None else "--add-section"
    with tempfile.NamedTemporaryFile(prefix="mneme-section-", suffix=".bin", delete=False) as tmp:
        tmp.write(data)
    try:
        cmd = [find_objcopy(), f"{option}", f"{SECTION_NAME}={tmp.name}"]
        if option == "--add-section":
            cmd += ["--set-section-alignment", f"{SECTION_NAME}=8"]
        proc = subprocess.run([*cmd, path], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise EmbedError(f"objcopy failed on {path}: {proc.stderr.strip()}")
    finally:
        os.unlink(tmp.name)
    return len(decode_records(data))
