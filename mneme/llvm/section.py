"""The ``.mneme_bitcode`` ELF section: kernel bitcode records an instrumented build embeds.

Standard library only: the compiler wrappers (``mneme config cxx``) import it
while a user's build runs, where no third-party package may be installed.

The section is a sequence of records. The linker concatenates the sections of
all objects of a program (possibly padding between them), so every record is
self-delimiting and starts on an 8-byte boundary; readers skip zero bytes
between records::

    offset  size  field
    0       8     magic  b"MNEMEIR1"
    8       4     header length H (little-endian u32)
    12      4     reserved, 0
    16      8     payload length P (little-endian u64)
    24      H     header: UTF-8 JSON object
    24+H    P     payload: LLVM bitcode, raw or zlib-compressed (header "encoding")
    ...           zero padding to a multiple of 8

Header keys: ``kernels`` (mangled names of the kernels whose code the payload
holds, with everything they need), ``source`` (the CUDA source file), ``arch``
(``sm_XX`` the device code was compiled for), ``producer`` (the clang version),
``encoding`` (``raw`` or ``zlib``), ``sha256`` (hex digest of the uncompressed
bitcode) and ``size`` (its length).
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from dataclasses import dataclass, field

SECTION_NAME = ".mneme_bitcode"
MAGIC = b"MNEMEIR1"
ALIGNMENT = 8
_FIXED = struct.Struct("<8sIIQ")


class SectionFormatError(ValueError):
    """The section bytes are not a valid sequence of records (truncated or foreign data)."""


@dataclass(frozen=True)
class BitcodeRecord:
    """One embedded module: the bitcode of ``kernels`` and what they call."""

    kernels: tuple[str, ...]
    bitcode: bytes
    source: str = ""
    arch: str = ""
    producer: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.bitcode).hexdigest()

    def encode(self, compress: bool = True) -> bytes:
        """The record's bytes, padded to the record alignment."""
        payload = zlib.compress(self.bitcode, 6) if compress else self.bitcode
        header = dict(self.extra)
        header.update(
            kernels=list(self.kernels),
            source=self.source,
            arch=self.arch,
            producer=self.producer,
            encoding="zlib" if compress else "raw",
            sha256=self.sha256,
            size=len(self.bitcode),
        )
        head = json.dumps(header, sort_keys=True).encode("utf-8")
        out = _FIXED.pack(MAGIC, len(head), 0, len(payload)) + head + payload
        return out + b"\0" * (-len(out) % ALIGNMENT)


def encode_records(records: list[BitcodeRecord]) -> bytes:
    """Section contents for ``records``, duplicates (same kernels and bitcode) dropped."""
    seen: set[tuple[tuple[str, ...], str]] = set()
    parts = []
    for record in records:
        key = (record.kernels, record.sha256)
        if key not in seen:
            seen.add(key)
            parts.append(record.encode())
    return b"".join(parts)


def decode_records(data: bytes) -> list[BitcodeRecord]:
    """Parse section contents; raise :class:`SectionFormatError` naming the offset of bad data."""
    records: list[BitcodeRecord] = []
    pos = 0
    view = memoryview(data)
    while pos < len(data):
        if data[pos] == 0:  # inter-record padding added by the record format or the linker
            pos += 1
            continue
        if len(data) - pos < _FIXED.size:
            raise SectionFormatError(f"truncated record header at offset {pos}")
        magic, head_len, _reserved, payload_len = _FIXED.unpack_from(data, pos)
        if magic != MAGIC:
            raise SectionFormatError(f"no record magic at offset {pos} (found {bytes(magic)!r})")
        start = pos + _FIXED.size
        end = start + head_len + payload_len
        if end > len(data):
            raise SectionFormatError(f"record at offset {pos} runs past the end of the section")
        try:
            header = json.loads(bytes(view[start : start + head_len]).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SectionFormatError(f"record at offset {pos} has an unreadable header: {exc}") from None
        payload = bytes(view[start + head_len : end])
        encoding = header.get("encoding", "raw")
        if encoding == "zlib":
            try:
                payload = zlib.decompress(payload)
            except zlib.error as exc:
                raise SectionFormatError(f"record at offset {pos}: corrupt compressed bitcode ({exc})") from None
        elif encoding != "raw":
            raise SectionFormatError(f"record at offset {pos}: unknown encoding {encoding!r}")
        if "sha256" in header and hashlib.sha256(payload).hexdigest() != header["sha256"]:
            raise SectionFormatError(f"record at offset {pos}: bitcode does not match its SHA-256")
        known = {"kernels", "source", "arch", "producer", "encoding", "sha256", "size"}
        records.append(
            BitcodeRecord(
                kernels=tuple(header.get("kernels", ())),
                bitcode=payload,
                source=header.get("source", ""),
                arch=header.get("arch", ""),
                producer=header.get("producer", ""),
                extra={k: v for k, v in header.items() if k not in known},
            )
        )
        pos = end
    return records
