"""Snapshot files (``.mneme``): the device memory of one launch, before or after it ran.

A snapshot file is a small manifest; the bytes live in shared chunks
(:mod:`mneme.format.chunks`). File layout (all integers little-endian)::

    b"MNEMESNP"                 8-byte magic
    u32 format version          2 (chunks named by BLAKE3) or 1 (by SHA-256)
    u32 N                       header length
    N bytes                     UTF-8 JSON header
    32 bytes                    SHA-256 of the N header bytes

The header describes the regions: base address, size, kind, name, chunk list
and optional verification policy (docs/format.md has the schema). The version
says which hash names the chunks (:mod:`mneme.format.content_hash`): a
snapshot is written in the version of its chunks' hash, so one written with
SHA-256 chunks is byte for byte what version 1 wrote. A region of
kind ``array`` holds a CUDA array's contents; its base is the array's handle in
the recorded process and its ``array`` field the array's shape
(:class:`mneme.format.textures.ArrayShape`).
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from mneme.errors import ArtifactError
from mneme.format.chunks import DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE, ChunkRef, read_chunks, read_chunks_into
from mneme.format.content_hash import DEFAULT_CHUNK_HASH, SNAPSHOT_VERSIONS
from mneme.format.layout import PHASES, is_hash_id, is_sha256_hex, snapshot_name
from mneme.format.policy import VerifyPolicy
from mneme.format.schema import JsonReader
from mneme.format.textures import ArrayShape
from mneme.store.base import Store

MAGIC = b"MNEMESNP"
#: The newest version (what writers use with the default chunk hash); readers take every version up to it.
SNAPSHOT_VERSION = 2
_HASH_OF_VERSION = {version: algorithm for algorithm, version in SNAPSHOT_VERSIONS.items()}
_DISPLAY = {"sha256": "SHA-256", "blake3": "BLAKE3"}
REGION_KINDS = ("heap", "global", "parameter", "array")
#: Kinds whose regions are device address ranges that must not overlap.
ADDRESS_KINDS = ("heap", "global")
_PREAMBLE = struct.Struct("<8sII")
_DIGEST_SIZE = 32
#: A header larger than this is not a manifest we wrote (64 MiB is ~500k chunk refs).
MAX_HEADER_SIZE = 64 << 20
_U64 = 2**64


@dataclass(frozen=True)
class Region:
    """One recorded memory range and where its bytes are stored.

    Attributes:
        base: the recorded address (for an ``array``, the array's recorded handle).
        size: the length in bytes.
        kind: ``heap``, ``global``, ``parameter`` or ``array``.
        name: a label (a global's symbol, for instance).
        chunks: the stored chunks of its bytes, in order.
        policy: how the replay compares it (None: bitwise).
        array: a CUDA array's shape (kind ``array`` only).
        origin: the snapshot file it was read from (for error messages only; not stored).
    """

    base: int
    size: int
    kind: str
    name: str = ""
    chunks: tuple[ChunkRef, ...] = ()
    policy: VerifyPolicy | None = None
    #: A CUDA array's shape (kind ``array`` only; its base is then the array's recorded handle).
    array: ArrayShape | None = None
    #: The snapshot file this region was read from (for error messages only; not stored).
    origin: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        # Accept any sequence of (digest, length[, algorithm]) tuples; keep an immutable tuple of ChunkRef.
        object.__setattr__(self, "chunks", tuple(ChunkRef(*c) for c in self.chunks))

    @property
    def end(self) -> int:
        """The first address after the region."""
        return self.base + self.size

    @property
    def verify_policy(self) -> VerifyPolicy:
        """The policy the replay applies: the declared one, else bitwise."""
        return self.policy or VerifyPolicy()

    def read(self, store: Store, *, what: str | None = None) -> bytes:
        """The region's bytes, every chunk verified.

        Args:
            store: the store holding the chunks.
            what: what it is, for error messages (default: the region and its snapshot).

        Returns:
            The bytes.

        Raises:
            ArtifactError: a chunk is missing or does not match its name.
        """
        return read_chunks(store, self.chunks, what=what or self._what())

    def read_into(self, store: Store, out: memoryview | bytearray, *, what: str | None = None) -> None:
        """Fill ``out`` (``size`` bytes) with the region's verified bytes.

        Args:
            store: the store holding the chunks.
            out: the buffer, ``size`` bytes long.
            what: what it is, for error messages (default: the region and its snapshot).

        Raises:
            ArtifactError: a chunk is missing or does not match its name.
        """
        read_chunks_into(store, self.chunks, out, what=what or self._what())

    def _what(self) -> str:
        region = f"region {self.name or hex(self.base)}"
        return f"{region} of {self.origin}" if self.origin else region

    def to_dict(self) -> dict[str, Any]:
        """The region as the snapshot header writes it.

        Returns:
            A new dict.
        """
        out = {
            "base": self.base,
            "size": self.size,
            "kind": self.kind,
            "name": self.name,
            "chunks": [[c.digest, c.length] for c in self.chunks],
            "policy": None if self.policy is None else self.policy.to_dict(),
        }
        if self.array is not None:  # only then: snapshots without arrays keep their bytes
            out["array"] = self.array.to_dict()
        return out


@dataclass(frozen=True)
class Snapshot:
    """The memory state of one launch at one phase (prologue: before, epilogue: after).

    Attributes:
        static_hash: the kernel's static hash.
        dynamic_hash: the instance's dynamic hash.
        phase: ``prologue`` or ``epilogue``.
        regions: the recorded memory ranges.
        chunk_size: bytes per chunk.
    """

    static_hash: str
    dynamic_hash: str
    phase: str
    regions: tuple[Region, ...] = ()
    chunk_size: int = DEFAULT_CHUNK_SIZE

    def __post_init__(self) -> None:
        object.__setattr__(self, "regions", tuple(self.regions))

    @property
    def name(self) -> str:
        """The object name of this snapshot in a recording directory."""
        return snapshot_name(self.phase, self.static_hash, self.dynamic_hash)

    @property
    def total_size(self) -> int:
        """The regions' bytes in all."""
        return sum(r.size for r in self.regions)

    def regions_of_kind(self, kind: str) -> list[Region]:
        """The regions of one kind.

        Args:
            kind: ``heap``, ``global``, ``parameter`` or ``array``.

        Returns:
            Those regions, in order.
        """
        return [r for r in self.regions if r.kind == kind]

    def region_named(self, name: str) -> Region:
        """The region labelled ``name``.

        Args:
            name: the region's label.

        Returns:
            The first region of that name.

        Raises:
            ArtifactError: no region has that name.
        """
        for r in self.regions:
            if r.name == name:
                return r
        raise ArtifactError(
            f"snapshot {self.name} has no region named {name!r}; regions: {', '.join(r.name for r in self.regions)}"
        )

    def chunk_refs(self) -> set[ChunkRef]:
        """Every chunk the regions name, each once.

        Returns:
            A new set.
        """
        return {c for r in self.regions for c in r.chunks}

    @property
    def chunk_hash(self) -> str:
        """The algorithm that names this snapshot's chunks (the default when it has none).

        Raises ArtifactError when its chunks mix algorithms (a snapshot file names one).
        """
        found = {c.algorithm for r in self.regions for c in r.chunks}
        if len(found) > 1:
            raise ArtifactError(f"snapshot {self.name} mixes chunk hashes ({', '.join(sorted(found))}); a snapshot uses one")
        return found.pop() if found else DEFAULT_CHUNK_HASH

    @property
    def version(self) -> int:
        """The format version of this snapshot's file: the one of its chunk hash."""
        return SNAPSHOT_VERSIONS[self.chunk_hash]

    def to_header(self) -> dict[str, Any]:
        """The snapshot file's header.

        Returns:
            A new dict.
        """
        return {
            "static_hash": self.static_hash,
            "dynamic_hash": self.dynamic_hash,
            "phase": self.phase,
            "chunk_size": self.chunk_size,
            "regions": [r.to_dict() for r in self.regions],
        }

    def validate(self) -> None:
        """Raise ArtifactError if this snapshot would not read back (the writer's check)."""
        parse_header(self.to_header(), self.name, self.version)


# -- encoding -----------------------------------------------------------------


def encode_snapshot(snapshot: Snapshot) -> bytes:
    """The bytes of a snapshot file (validated first: we never write what we cannot read)."""
    header = snapshot.to_header()
    version = snapshot.version
    parse_header(header, snapshot.name, version)
    body = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    return _PREAMBLE.pack(MAGIC, version, len(body)) + body + hashlib.sha256(body).digest()


def decode_snapshot(data: bytes | memoryview, what: str = "snapshot") -> Snapshot:
    """Parse snapshot file bytes; every problem is an ArtifactError naming ``what``."""
    data = bytes(data)
    if len(data) < _PREAMBLE.size:
        raise ArtifactError(
            f"{what}: truncated: {len(data)} bytes, shorter than the {_PREAMBLE.size}-byte preamble"
        )
    magic, version, header_len = _PREAMBLE.unpack_from(data)
    if magic != MAGIC:
        raise ArtifactError(f"{what}: not a mneme snapshot (bad magic {magic!r}, expected {MAGIC!r})")
    if version > SNAPSHOT_VERSION:
        raise ArtifactError(
            f"{what}: snapshot format version {version} is newer than this mneme reads "
            f"(up to {SNAPSHOT_VERSION}); upgrade mneme"
        )
    if version < 1:
        raise ArtifactError(f"{what}: invalid snapshot format version {version}")
    if header_len > MAX_HEADER_SIZE:
        raise ArtifactError(f"{what}: header length {header_len} exceeds {MAX_HEADER_SIZE}; the file is corrupt")
    expected = _PREAMBLE.size + header_len + _DIGEST_SIZE
    if len(data) < expected:
        raise ArtifactError(f"{what}: truncated: {len(data)} bytes, the header says {expected}")
    if len(data) > expected:
        raise ArtifactError(f"{what}: {len(data) - expected} unexpected trailing bytes; the file is corrupt")
    body = data[_PREAMBLE.size : _PREAMBLE.size + header_len]
    if hashlib.sha256(body).digest() != data[_PREAMBLE.size + header_len :]:
        raise ArtifactError(f"{what}: header checksum mismatch; the file is corrupt")
    try:
        header = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ArtifactError(f"{what}: header is not valid UTF-8 JSON ({exc})") from None
    except RecursionError:
        raise ArtifactError(f"{what}: header JSON is nested too deeply; the file is corrupt") from None
    return parse_header(header, what, version)


def parse_header(header: Any, what: str, version: int = SNAPSHOT_VERSION) -> Snapshot:
    """Validate a header (the parsed JSON) of a snapshot file of ``version`` and build the Snapshot.

    Args:
        header: the parsed JSON header.
        what: names the file in errors.
        version: the file's format version, which says the hash that names its chunks.

    Returns:
        The Snapshot, its chunk refs carrying their hash algorithm.
    """
    algorithm = _HASH_OF_VERSION[version]
    r = JsonReader(what)
    h = r.obj(header, "", required=("static_hash", "dynamic_hash", "phase", "chunk_size", "regions"))
    static = r.str(h["static_hash"], "static_hash")
    dynamic = r.str(h["dynamic_hash"], "dynamic_hash")
    for key, value in (("static_hash", static), ("dynamic_hash", dynamic)):
        if not is_hash_id(value):
            raise r.error(key, f"{value!r} is not a hash id (a decimal unsigned 64-bit integer)")
    phase = r.choice(h["phase"], "phase", PHASES)
    chunk_size = r.int(h["chunk_size"], "chunk_size", 1, MAX_CHUNK_SIZE)
    regions = tuple(
        _parse_region(r, value, f"regions[{i}]", chunk_size, algorithm)
        for i, value in enumerate(r.list(h["regions"], "regions"))
    )
    _check_layout(r, regions)
    return Snapshot(static, dynamic, phase, tuple(replace(reg, origin=what) for reg in regions), chunk_size)


def _parse_region(r: JsonReader, value: Any, where: str, chunk_size: int, algorithm: str) -> Region:
    d = r.obj(value, where, required=("base", "size", "kind", "name", "chunks"), optional=("policy", "array"))
    base = r.int(d["base"], f"{where}.base", 0, _U64 - 1)
    size = r.int(d["size"], f"{where}.size", 0, _U64 - 1)
    if base + size > _U64:
        raise r.error(where, f"range {base:#x}+{size} passes the end of the 64-bit address space")
    kind = r.choice(d["kind"], f"{where}.kind", REGION_KINDS)
    name = r.str(d["name"], f"{where}.name")
    chunks = []
    total = 0
    raw_chunks = r.list(d["chunks"], f"{where}.chunks")
    for j, c in enumerate(raw_chunks):
        cw = f"{where}.chunks[{j}]"
        if not isinstance(c, list) or len(c) != 2:
            raise r.error(cw, f"expected [{algorithm} hex, length]")
        if not is_sha256_hex(c[0]):
            raise r.error(cw, f"{c[0]!r} is not a {_DISPLAY[algorithm]} hex digest")
        length = r.int(c[1], cw + "[1]", 1, chunk_size)
        if length != chunk_size and j != len(raw_chunks) - 1:
            raise r.error(cw, f"only the last chunk may be shorter than the chunk size {chunk_size}")
        chunks.append(ChunkRef(c[0], length, algorithm))
        total += length
    if total != size:
        raise r.error(where, f"chunk lengths add up to {total}, the region size is {size}")
    policy_value = d.get("policy")
    policy = None
    if policy_value is not None:
        policy = VerifyPolicy.from_dict(policy_value, f"{r.what}: {where}.policy")
        if size % policy.element_size:
            raise r.error(
                f"{where}.policy",
                f"region size {size} is not a multiple of the {policy.dtype} element size {policy.element_size}",
            )
    array = None
    if kind == "array" or "array" in d:
        if kind != "array" or "array" not in d:
            raise r.error(where, "a region of kind 'array' has an 'array' shape, and only such a region")
        array = ArrayShape.parse(r, d["array"], f"{where}.array")
        if array.size != size:
            raise r.error(where, f"the array's shape holds {array.size} bytes, the region {size}")
    return Region(base, size, kind, name, tuple(chunks), policy, array)


def _check_layout(r: JsonReader, regions: Sequence[Region]) -> None:
    """Regions of each address kind are sorted by base; no two address regions overlap."""
    for kind in ADDRESS_KINDS:
        bases = [reg.base for reg in regions if reg.kind == kind]
        if bases != sorted(bases):
            raise r.error("regions", f"{kind} regions are not sorted by base address")
    spans = sorted(
        ((reg.base, reg.end, i) for i, reg in enumerate(regions) if reg.kind in ADDRESS_KINDS and reg.size > 0)
    )
    for (b0, e0, i0), (b1, _, i1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise r.error("regions", f"regions[{i0}] ({b0:#x}..{e0:#x}) and regions[{i1}] (from {b1:#x}) overlap")
    arrays = [reg.base for reg in regions if reg.kind == "array"]
    if len(set(arrays)) != len(arrays):
        raise r.error("regions", "two array regions have the same base (an array's recorded handle)")


# -- store access ---------------------------------------------------------------


def write_snapshot(store: Store, snapshot: Snapshot) -> tuple[str, str, int]:
    """Store the snapshot file (its chunks must be stored already); return (name, sha256, size).

    Args:
        store: the store.
        snapshot: the snapshot, its chunks already stored.

    Returns:
        ``(name, sha256, size)`` of the file written.
    """
    data = encode_snapshot(snapshot)
    store.put(snapshot.name, data)
    return snapshot.name, hashlib.sha256(data).hexdigest(), len(data)


def read_snapshot(
    store: Store,
    name: str,
    *,
    sha256: str | None = None,
    size: int | None = None,
) -> Snapshot:
    """Read and validate snapshot ``name``; with ``sha256``/``size`` (from the database) check the file too.

    Args:
        store: the store.
        name: the snapshot file's object name.
        sha256: the file's SHA-256 the database names.
        size: its size the database names.

    Returns:
        The ``Snapshot`` (header; region bytes are read on demand).

    Raises:
        ArtifactError: missing, damaged, or not what the database names.
    """
    what = f"snapshot {name} in {store.url}"
    data = store.get(name)
    if size is not None and len(data) != size:
        raise ArtifactError(f"{what}: {len(data)} bytes, the recording database says {size}; the file is corrupt")
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise ArtifactError(f"{what}: content does not match the SHA-256 in the recording database; the file is corrupt")
    return decode_snapshot(data, what)


def build_snapshot(
    static_hash: str,
    dynamic_hash: str,
    phase: str,
    regions: Sequence[Region],
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Snapshot:
    """A Snapshot with regions put in the canonical order (kind, then base) and validated."""
    order = {k: i for i, k in enumerate(REGION_KINDS)}
    ordered = tuple(sorted(regions, key=lambda reg: (order.get(reg.kind, len(order)), reg.base, reg.name)))
    snapshot = Snapshot(static_hash, dynamic_hash, phase, ordered, chunk_size)
    snapshot.validate()
    return snapshot
