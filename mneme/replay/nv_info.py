"""The per-kernel attributes of a cubin: its ``.nv.info.<kernel>`` section.

ptxas writes, for every kernel, a list of attributes (``EIATTR_*``) that the
driver reads when it loads and launches the kernel. Two of them say which block
shapes launch at all: ``EIATTR_REQNTID`` (PTX ``.reqntid``: the block must be
exactly this shape) and ``EIATTR_MAX_THREADS`` (PTX ``.maxntid``, nvcc
``__launch_bounds__``: at most this many threads). A SASS-only kernel (cuBLAS,
cuDNN, a Triton cubin without its PTX) carries them only here.

Each entry is a format byte (``EIFMT_NVAL`` 1: no value, ``EIFMT_BVAL`` 2: a
byte, ``EIFMT_HVAL`` 3: a 16-bit value, each inline in 2 bytes; ``EIFMT_SVAL``
4: a 16-bit size, then that many bytes), an attribute byte, and the value. The
codes were checked against nvcc 13.0's cubins (tests/mneme/replay/test_block_limits.py
builds them from CUDA sources with ``__block_size__`` and ``__launch_bounds__``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from mneme.errors import ArtifactError
from mneme.llvm.elf import ElfError, read_section

EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4
EIATTR_MAX_THREADS = 0x05
EIATTR_REQNTID = 0x10


@dataclass(frozen=True)
class NvInfoAttribute:
    """One attribute of a kernel: its ``EIATTR_*`` code and value bytes (inline values: 2 bytes)."""

    code: int
    value: bytes

    def dims(self) -> tuple[int, int, int]:
        """The value as three 32-bit extents (x, y, z), as REQNTID and MAX_THREADS carry them."""
        if len(self.value) != 12:
            raise ArtifactError(f".nv.info attribute 0x{self.code:02x} holds {len(self.value)} bytes, not 3 extents")
        x, y, z = struct.unpack("<III", self.value)
        return (x, y, z)


def section_name(kernel: str) -> str:
    return f".nv.info.{kernel}"


def kernel_attributes(cubin: bytes, kernel: str) -> list[NvInfoAttribute] | None:
    """The attributes ptxas wrote for ``kernel`` (its mangled name); None when the cubin has no
    section for it. ArtifactError when the cubin or the section cannot be read."""
    try:
        data = read_section(cubin, section_name(kernel))
    except ElfError as exc:
        raise ArtifactError(f"the cubin of {kernel} cannot be read: {exc}") from None
    return None if data is None else parse_attributes(data, kernel)


def parse_attributes(data: bytes, kernel: str = "") -> list[NvInfoAttribute]:
    """The entries of one ``.nv.info`` section."""
    out = []
    offset = 0
    while offset < len(data):
        if offset + 4 > len(data):
            raise ArtifactError(f"{section_name(kernel)} ends inside an entry (offset {offset} of {len(data)})")
        fmt, code = data[offset], data[offset + 1]
        if fmt == EIFMT_SVAL:
            (size,) = struct.unpack_from("<H", data, offset + 2)
            end = offset + 4 + size
            if end > len(data):
                raise ArtifactError(f"{section_name(kernel)}: attribute 0x{code:02x} runs past the section's end")
            out.append(NvInfoAttribute(code, bytes(data[offset + 4 : end])))
            offset = end
        elif fmt in (EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL):
            out.append(NvInfoAttribute(code, bytes(data[offset + 2 : offset + 4])))
            offset += 4
        else:
            raise ArtifactError(f"{section_name(kernel)}: unknown entry format {fmt} at offset {offset}")
    return out
