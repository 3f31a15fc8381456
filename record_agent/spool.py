"""Reading the spool the native recorder writes (the contract is record_agent/README.md).

Everything here is plain data: the recorder commits an entry by renaming its
directory into place, so a directory without the ``.tmp`` suffix is complete.
A crash leaves ``.tmp`` directories behind; they are not entries.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mneme.errors import ArtifactError
from mneme.format.schema import JsonReader
from mneme.format.textures import ArrayShape

ENTRY_FORMAT = "mneme-spool-entry/4"
#: Formats this agent reads: /2 has no per-phase digests (every piece copied); /2 and /3 list the texture and
#: surface objects alive at the launch by handle only (no ``objects``, no CUDA arrays): they are not captured.
ENTRY_FORMATS = ("mneme-spool-entry/2", "mneme-spool-entry/3", ENTRY_FORMAT)


@dataclass(frozen=True)
class SpoolPiece:
    """``size`` bytes of a region at ``offset`` of stripe file ``<phase>.<stripe>.bin``."""

    stripe: int
    offset: int
    size: int


@dataclass(frozen=True)
class PhaseDigests:
    """A phase's GPU digests of a region's pieces ("" where none), and the pieces not copied (holes)."""

    digests: tuple[str, ...]
    skipped: frozenset[int]


@dataclass(frozen=True)
class SpoolRegion:
    """A device range and where its bytes sit in the stripe files (same layout in both phases).

    ``phases`` (absent when the GPU computed no digests) says per phase which
    pieces were not copied: their bytes equal those of an earlier piece with
    the same digest (and size), captured by this entry or a committed one.
    """

    kind: str
    name: str
    base: int
    size: int
    pieces: tuple[SpoolPiece, ...]
    policy: dict[str, Any] | None = None
    phases: dict[str, PhaseDigests] = field(default_factory=dict, compare=False)
    array: ArrayShape | None = None  # kind "array": a CUDA array's shape (its base is the array's handle)

    def digest(self, phase: str, k: int) -> str:
        p = self.phases.get(phase)
        return p.digests[k] if p else ""

    def copied(self, phase: str, k: int) -> bool:
        p = self.phases.get(phase)
        return p is None or k not in p.skipped


@dataclass(frozen=True)
class SpoolAllocation:
    base: int
    size: int
    in_window: bool
    managed: bool = False  # cudaMallocManaged: captured like device memory, at the driver's address


@dataclass(frozen=True)
class ForeignRange:
    """Memory the recorder saw but does not capture: ``kind`` is host (mapped pinned) or ipc."""

    kind: str
    base: int
    size: int


@dataclass(frozen=True)
class ForeignReference:
    """A pointer (``target``) into uncaptured memory found in the captured region at ``region`` (reachable scope)."""

    region: int
    target: int


@dataclass(frozen=True)
class SpoolObject:
    """A texture or surface object alive at the launch, with its descriptors as the recorder read them.

    ``resource``, ``texture`` and ``view`` are the JSON of ``mneme.format.textures`` (Resource, TextureDesc,
    ViewDesc); ``unsupported`` says why the recorder could not capture the object ('' when it could).
    """

    kind: str  # "texture" | "surface"
    handle: int
    resource: dict[str, Any] | None = None
    texture: dict[str, Any] | None = None
    view: dict[str, Any] | None = None
    unsupported: str = ""


#: Why an object of an entry written by a recorder that does not capture them is not captured.
OLD_RECORDER_OBJECTS = "the recorder that wrote this spool entry does not capture texture and surface objects"


@dataclass(frozen=True)
class SpoolWindow:
    device: int
    base: int
    size: int
    reserved: bool


@dataclass(frozen=True)
class SpoolEntry:
    """One recorded launch, as the recorder committed it."""

    path: Path
    seq: int
    kernel: str
    demangled: str
    api: str
    launch_index: int
    device: int
    device_name: str
    arch: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    module_id: int
    param_offsets: tuple[int, ...]
    param_sizes: tuple[int, ...]
    args: bytes
    regions: tuple[SpoolRegion, ...]
    allocations: tuple[SpoolAllocation, ...]
    windows: tuple[SpoolWindow, ...]
    snapshot_scope: str
    pool_allocator: str  # what made --snapshot-scope auto pick reachable ("" when it did not)
    warnings: tuple[str, ...]
    attributes: tuple[dict[str, Any], ...] = ()
    stripes: int = 1
    rank: str = ""
    prologue_seconds: float = 0.0
    epilogue_seconds: float = 0.0
    prologue_bytes: int = 0
    foreign_memory: tuple[ForeignRange, ...] = ()
    foreign_references: tuple[ForeignReference, ...] = ()
    texture_objects: tuple[int, ...] = ()
    surface_objects: tuple[int, ...] = ()
    objects: tuple[SpoolObject, ...] = ()  # the texture and surface objects alive at the launch, described
    #: Why the recorder abandoned this launch (a wait past its deadline); "" for a captured one. An abandoned
    #: entry has no snapshot files (``stripes`` 0, no regions): the agent writes it ``supported: false``.
    abandoned: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def stripe_path(self, phase: str, stripe: int) -> Path:
        return self.path / f"{phase}.{stripe}.bin"

    @property
    def window(self) -> SpoolWindow | None:
        for w in self.windows:
            if w.device == self.device:
                return w
        return None


def _dims(value: Any, what: str) -> tuple[int, int, int]:
    if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, int) and v > 0 for v in value)):
        raise ArtifactError(f"{what}: expected three positive integers, got {value!r}")
    return (value[0], value[1], value[2])


def _phase_digests(value: Any, pieces: int, what: str) -> PhaseDigests:
    digests = tuple(str(d) for d in value["digests"])
    skipped = frozenset(int(k) for k in value["skipped"])
    if len(digests) != pieces:
        raise ArtifactError(f"{what}: {len(digests)} digests for {pieces} pieces")
    if any(not 0 <= k < pieces or not digests[k] for k in skipped):
        raise ArtifactError(f"{what}: a piece not copied has no digest or is out of range")
    return PhaseDigests(digests, skipped)


def _array_shape(region: dict[str, Any], what: str) -> ArrayShape | None:
    if region["kind"] != "array":
        return None
    where = f"region {int(region['base']):#x}"
    shape = ArrayShape.parse(JsonReader(what), region.get("array"), f"{where}.array")
    if shape.size != int(region["size"]):
        raise ArtifactError(f"{what}: {where}: the array's shape holds {shape.size} bytes, the region {region['size']}")
    return shape


def _objects(data: dict[str, Any]) -> tuple[SpoolObject, ...]:
    """The entry's texture and surface objects; an entry without ``objects`` lists their handles only."""
    if data.get("objects") is None:
        return tuple(SpoolObject(kind, int(h), unsupported=OLD_RECORDER_OBJECTS)
                     for kind, key in (("texture", "texture_objects"), ("surface", "surface_objects"))
                     for h in data.get(key, ()))  # fmt: skip
    out = []
    for o in data["objects"]:
        kind = str(o["kind"])
        if kind not in ("texture", "surface"):
            raise ValueError(f"an object of kind {kind!r}")
        out.append(SpoolObject(kind, int(o["handle"]), o.get("resource"), o.get("texture"), o.get("view"),
                               str(o.get("unsupported", ""))))  # fmt: skip
    return tuple(out)


def read_entry(path: str | os.PathLike[str]) -> SpoolEntry:
    """Parse ``path/launch.json`` and check the snapshot files hold every region it lists."""
    path = Path(path)
    what = f"spool entry {path}"
    try:
        data = json.loads((path / "launch.json").read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{what}: cannot read launch.json ({exc}); the recorder died while writing it?") from exc
    if data.get("format") not in ENTRY_FORMATS:
        raise ArtifactError(f"{what}: format {data.get('format')!r} is not {ENTRY_FORMAT!r}; agent and recorder versions differ")
    try:
        regions = tuple(
            SpoolRegion(
                r["kind"], r.get("name", ""), int(r["base"]), int(r["size"]),
                tuple(SpoolPiece(int(k), int(o), int(n)) for k, o, n in r["pieces"]), r.get("policy"),
                {phase: _phase_digests(r[phase], len(r["pieces"]), f"{what}: region {int(r['base']):#x} {phase}")
                 for phase in ("prologue", "epilogue") if phase in r},
                _array_shape(r, what),
            )
            for r in data["regions"]
        )  # fmt: skip
        args = bytes.fromhex(data["args"])
        entry = SpoolEntry(
            path=path,
            seq=int(data["seq"]),
            kernel=data["kernel"],
            demangled=data.get("demangled", ""),
            api=data.get("api", ""),
            launch_index=int(data["launch_index"]),
            device=int(data["device"]),
            device_name=data.get("device_name", ""),
            arch=data.get("arch", "sm_90"),
            grid=_dims(data["grid"], f"{what}: grid"),
            block=_dims(data["block"], f"{what}: block"),
            shared_mem=int(data["shared_mem"]),
            module_id=int(data["module_id"]),
            param_offsets=tuple(int(v) for v in data["param_offsets"]),
            param_sizes=tuple(int(v) for v in data["param_sizes"]),
            args=args,
            regions=regions,
            allocations=tuple(SpoolAllocation(int(a["base"]), int(a["size"]), bool(a["in_window"]), bool(a.get("managed", False))) for a in data["allocations"]),
            windows=tuple(SpoolWindow(int(w["device"]), int(w["base"]), int(w["size"]), bool(w["reserved"])) for w in data["windows"]),
            snapshot_scope=data.get("snapshot_scope", "all"),
            pool_allocator=str(data.get("pool_allocator", "")),
            warnings=tuple(data.get("warnings", ())),
            attributes=tuple(data.get("attributes", ())),
            stripes=int(data["stripes"]),
            rank=str(data.get("rank", "")),
            prologue_seconds=float(data.get("prologue_seconds", 0.0)),
            epilogue_seconds=float(data.get("epilogue_seconds", 0.0)),
            prologue_bytes=int(data.get("prologue_bytes", 0)),
            foreign_memory=tuple(
                ForeignRange(str(f["kind"]), int(f["base"]), int(f["size"])) for f in data.get("foreign_memory", ())
            ),
            foreign_references=tuple(
                ForeignReference(int(f["region"]), int(f["target"]))
                for f in data.get("foreign_references", ())
            ),
            texture_objects=tuple(int(h) for h in data.get("texture_objects", ())),
            surface_objects=tuple(int(h) for h in data.get("surface_objects", ())),
            objects=_objects(data),
            abandoned=str(data.get("abandoned", "")),
            raw=data,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{what}: launch.json is incomplete or malformed ({exc!r})") from exc
    if len(entry.param_offsets) != len(entry.param_sizes):
        raise ArtifactError(f"{what}: param_offsets and param_sizes differ in length")
    if entry.abandoned and (regions or entry.stripes):
        raise ArtifactError(f"{what}: an abandoned entry lists snapshot regions; agent and recorder versions differ")
    need = [0] * entry.stripes
    for r in regions:
        if sum(p.size for p in r.pieces) != r.size:
            raise ArtifactError(f"{what}: the pieces of region {r.base:#x} do not add up to its {r.size} bytes")
        for p in r.pieces:
            if not 0 <= p.stripe < entry.stripes:
                raise ArtifactError(f"{what}: region {r.base:#x} names stripe {p.stripe} of {entry.stripes}")
            need[p.stripe] = max(need[p.stripe], p.offset + p.size)
    for phase in ("prologue", "epilogue"):
        for k, n in enumerate(need):
            f = entry.stripe_path(phase, k)
            size = f.stat().st_size if f.exists() else -1
            if size != n:
                raise ArtifactError(f"{what}: {f.name} holds {size} bytes, the regions need {n}")
    return entry


@dataclass(frozen=True)
class SpoolModule:
    """A module the application loaded: the image as loaded (cubin) and, where seen, its source (PTX or fatbin)."""

    module_id: int
    cubin: bytes
    source_kind: str
    source: bytes | None
    kernels: tuple[str, ...]
    globals: tuple[str, ...]


def read_module(spool_dir: str | os.PathLike[str], module_id: int) -> SpoolModule:
    base = Path(spool_dir) / "modules" / str(module_id)
    try:
        meta = json.loads(base.with_suffix(".json").read_text())
        cubin = base.with_suffix(".cubin").read_bytes()
        source = base.with_suffix(".src").read_bytes() if meta.get("source_size") else None
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"spool module {module_id} in {spool_dir}: cannot read it ({exc})") from exc
    if len(cubin) != meta.get("cubin_size"):
        raise ArtifactError(f"spool module {module_id}: cubin holds {len(cubin)} bytes, its metadata says {meta.get('cubin_size')}")
    return SpoolModule(module_id, cubin, meta.get("source_kind", ""), source, tuple(meta.get("kernels", ())), tuple(meta.get("globals", ())))


def committed_entries(spool_dir: str | os.PathLike[str]) -> list[Path]:
    """Committed entry directories, oldest first (``.tmp`` ones are still being written, or were abandoned)."""
    entries = Path(spool_dir) / "entries"
    if not entries.is_dir():
        return []
    return sorted(p for p in entries.iterdir() if p.is_dir() and not p.name.endswith(".tmp"))


def entries_in_order(spool_dir: str | os.PathLike[str]) -> list[Path]:
    """Committed entries to convert now, in commit order, none missing before the last.

    The recorder numbers entries as it commits them, and an entry may leave
    out a piece captured by an entry committed before it. A directory listing
    taken while entries are renamed into place may miss one committed before
    another it lists; a second listing, started after the first ended, holds
    every entry committed before any the first one saw. So: the second
    listing, up to the last number the first one saw.
    """
    first = committed_entries(spool_dir)
    if not first:
        return []
    last = first[-1].name
    return [p for p in committed_entries(spool_dir) if p.name <= last]


def abandoned_entries(spool_dir: str | os.PathLike[str]) -> list[Path]:
    entries = Path(spool_dir) / "entries"
    return sorted(p for p in entries.iterdir() if p.name.endswith(".tmp")) if entries.is_dir() else []


def read_json(path: Path) -> dict[str, Any] | None:
    """A small status file (recorder.json, done.json, error.json), or None if absent or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
