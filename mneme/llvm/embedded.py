"""Find the bitcode an instrumented build embedded for a kernel (recorder side).

The record agent calls :func:`find_kernel_bitcode` with the application's
executable (``/proc/<pid>/exe`` or its path) and the mangled name of a launched
kernel, and stores the result as ``RecordedIR_<static>.bc``. Standard library
only, so recording never needs llvmlite.
"""

from __future__ import annotations

import os

from mneme.errors import ArtifactError
from mneme.llvm import names
from mneme.llvm.elf import ElfError, read_section
from mneme.llvm.section import SECTION_NAME, BitcodeRecord, SectionFormatError, decode_records

ElfSource = str | os.PathLike | bytes | bytearray | memoryview


def _describe(source: ElfSource) -> str:
    return f"{len(source)} bytes of ELF" if isinstance(source, (bytes, bytearray, memoryview)) else str(source)


def read_records(source: ElfSource) -> list[BitcodeRecord]:
    """Every record of the ``.mneme_bitcode`` section; empty when the file has no such section.

    Raises ArtifactError for a file that is not ELF or whose section is damaged.
    """
    try:
        data = read_section(source, SECTION_NAME)
    except ElfError as exc:
        raise ArtifactError(f"{_describe(source)}: {exc}") from None
    except OSError as exc:
        raise ArtifactError(f"cannot read {_describe(source)}: {exc.strerror or exc}") from None
    if not data:
        return []
    try:
        return decode_records(data)
    except SectionFormatError as exc:
        raise ArtifactError(
            f"{_describe(source)}: section {SECTION_NAME} is damaged ({exc}); rebuild the program "
            "with `mneme config cxx` or add_mneme()"
        ) from None


def embedded_kernels(source: ElfSource) -> list[str]:
    """Names of all kernels that have embedded bitcode, in section order."""
    names: list[str] = []
    for record in read_records(source):
        names.extend(k for k in record.kernels if k not in names)
    return names


def find_kernel_record(source: ElfSource, kernel_name: str) -> BitcodeRecord | None:
    """The record holding ``kernel_name``: by exact name (the one with the fewest kernels
    when several hold it), else up to nvcc's anonymous-namespace mangling (names.py)."""
    records = read_records(source)
    exact = [r for r in records if kernel_name in r.kernels]
    if exact:
        return min(exact, key=lambda r: len(r.kernels))
    flat = [(record, name) for record in records for name in record.kernels]
    index = names.pick(kernel_name, [name for _, name in flat], [record.source for record, _ in flat])
    return None if index is None else flat[index][0]


def find_kernel_bitcode(elf_path_or_bytes: ElfSource, kernel_name: str) -> bytes | None:
    """The LLVM bitcode embedded for ``kernel_name`` (mangled), or None if the program carries none.

    None means: not an instrumented build, or this kernel's source was not
    compiled through the wrappers (the PTX tier still works for it). The
    bitcode may name the kernel differently (clang's anonymous-namespace
    mangling); compile_to_ptx(kernel=<recorded name>) renames it back.
    """
    record = find_kernel_record(elf_path_or_bytes, kernel_name)
    return record.bitcode if record else None
