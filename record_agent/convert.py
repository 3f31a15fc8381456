"""Spool entries -> recordings: one database per static kernel, written through ``mneme.format``.

Policy lives here, not in the recorder: which code identifies the kernel
(the module's PTX when it can be found, else the cubin as loaded), which
argument bytes are pointers, whether the addresses can be replayed as they
are, and how a declared verification policy maps onto the format's.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from mneme.errors import ArtifactError
from mneme.format import (
    AddressSpace,
    DeviceInfo,
    InstanceRecord,
    KernelCode,
    KernelParam,
    KernelSignature,
    ObjectRef,
    RecorderInfo,
    RecordingDatabase,
    RecordingWriter,
    Region,
    VerifyPolicy,
    dynamic_hash,
    load_database,
    new_database,
    static_hash,
    write_snapshot,
)
from mneme.format.capture import PipelineStats
from mneme.format.chunks import ChunkRef, FileSlice, read_chunks
from mneme.format.database import LaunchAttribute, attributes_key
from mneme.format.layout import PHASES
from mneme.format.schema import JsonReader
from mneme.format.snapshot import build_snapshot
from mneme.model.experiment import Dim3
from mneme.store import LocalStore, Store, open_store
from record_agent import fatbin, triton_cache
from record_agent.spool import (
    SpoolEntry,
    SpoolModule,
    entries_in_order,
    read_entry,
    read_module,
)
from record_agent.support import unsupported_reasons
from record_agent.textures import TexturePlan, plan_textures, region_bytes

POINTER_SIZE = 8


@dataclass(frozen=True)
class KernelCodeFiles:
    """What identifies and rebuilds a kernel: PTX (if found), the cubin as loaded, bitcode (if embedded)."""

    ptx: str | None
    cubin: bytes
    bitcode: bytes | None

    def identity(self) -> bytes | str:
        return self.ptx if self.ptx is not None else self.cubin


def pointer_offsets(args: bytes, entry: SpoolEntry) -> tuple[int, ...]:
    """Offsets of the 8-byte-aligned argument words whose value points into a recorded allocation or global.

    Words inside struct arguments count too: a struct of pointers passed by
    value carries pointers a relocating replay must rewrite.
    """
    ranges = [(a.base, a.base + max(a.size, 1)) for a in entry.allocations]
    ranges += [(r.base, r.base + max(r.size, 1)) for r in entry.regions if r.kind == "global"]
    found = []
    for off in range(0, len(args) - POINTER_SIZE + 1, POINTER_SIZE):
        value = int.from_bytes(args[off : off + POINTER_SIZE], "little")
        if value and any(lo <= value < hi for lo, hi in ranges):
            found.append(off)
    return tuple(found)


def kernel_params(entry: SpoolEntry, pointers: Sequence[int]) -> tuple[KernelParam, ...]:
    params = []
    for off, size in zip(entry.param_offsets, entry.param_sizes):
        if size == POINTER_SIZE and off in pointers:
            kind = "pointer"
        elif size <= POINTER_SIZE:
            kind = "scalar"
        else:
            kind = "bytes"
        params.append(KernelParam(off, size, kind))
    return tuple(params)


#: mneme/annotate.h spellings accepted besides the format's own.
_DTYPE_ALIASES = {
    "float32": "f32", "float": "f32", "float64": "f64", "double": "f64", "float16": "f16", "half": "f16",
    "bfloat16": "bf16", "int8": "i8", "uint8": "u8", "int16": "i16", "uint16": "u16", "int32": "i32",
    "int": "i32", "uint32": "u32", "int64": "i64", "uint64": "u64",
}  # fmt: skip
_NORM_ALIASES = {"max": "none", "elementwise": "none", "inf": "linf"}


def verify_policy(declared: dict | None) -> VerifyPolicy | None:
    """The format's policy for what the application declared with mneme/annotate.h (None: bitwise)."""
    if not declared:
        return None
    dtype = _DTYPE_ALIASES.get(declared.get("dtype", "u8"), declared.get("dtype", "u8"))
    norm = _NORM_ALIASES.get(declared.get("norm", "none"), declared.get("norm", "none"))
    return VerifyPolicy(dtype=dtype, mode=declared.get("mode", "bitwise"), threshold=float(declared.get("threshold", 0.0)), norm=norm)


def launch_attributes(entry: SpoolEntry) -> tuple[LaunchAttribute, ...]:
    """The launch attributes the recorder saw (cluster dimensions, cooperative, ...), checked."""
    r = JsonReader(f"spool entry {entry.path}")
    return tuple(LaunchAttribute.parse(r, a, f"attributes[{i}]") for i, a in enumerate(entry.attributes))


def region_name(kind: str, name: str, base: int) -> str:
    return name if name else f"{kind}@{base:#x}"


def address_space(entry: SpoolEntry) -> tuple[AddressSpace, list[str]]:
    """``fixed`` when every recorded heap region lies in the reserved window, else ``relocatable``."""
    window = entry.window
    heap = [r for r in entry.regions if r.kind == "heap"]
    if window is not None and window.reserved:
        outside = [r for r in heap if not (window.base <= r.base and r.base + r.size <= window.base + window.size)]
        if not outside:
            return AddressSpace("fixed", window.base, window.size), []
        return AddressSpace("relocatable", window.base, window.size), [
            f"{len(outside)} allocation(s) lie outside the fixed window (it was full): replay must relocate pointers; raise -vass"
        ]
    lo = min((r.base for r in heap), default=0)
    hi = max((r.base + r.size for r in heap), default=0)
    return AddressSpace("relocatable", lo, hi - lo), [
        "the fixed address window could not be reserved: replay must relocate pointers"
    ]


@dataclass
class EntryStats:
    """What recording one launch cost: in the application (the recorder's stall) and in the agent."""

    seq: int
    kernel: str
    snapshot_bytes: int  # prologue + epilogue: the device state the snapshots hold
    copied_bytes: int  # of which copied off the device (the rest was unchanged since an earlier capture)
    stall_s: float  # the application waited this long for both snapshots
    prologue_s: float
    epilogue_s: float
    spool_write_s: float  # span of the spool file writes of both phases
    spool_wait_s: float  # before the prologue, the application waited for the agent (spool full)
    digest_s: float  # of the stall: computing the GPU digests of both phases
    converted_at: float  # time.monotonic() when its conversion finished
    convert_s: float  # the agent's conversion of the entry, wall
    pipeline: PipelineStats
    snapshot_scope: str = "all"  # the scope the recorder used for this launch
    pool_allocator: str = ""  # what made --snapshot-scope auto pick reachable

    def as_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "pipeline"}
        return {**out, "pipeline": self.pipeline.as_dict(), "rates": self.pipeline.rates()}


@dataclass
class ConversionStats:
    instances: int = 0  # written to databases, abandoned ones included
    bytes: int = 0
    databases: set[str] = field(default_factory=set)
    kernels: set[str] = field(default_factory=set)
    entries: list[EntryStats] = field(default_factory=list)  # the captured instances
    abandoned: list[tuple[str, str]] = field(default_factory=list)  # (kernel, reason) of instances abandoned at a deadline

    @property
    def stall_s(self) -> float:
        return sum(e.stall_s for e in self.entries)

    @property
    def spool_wait_s(self) -> float:
        return sum(e.spool_wait_s for e in self.entries)

    @property
    def stored_bytes(self) -> int:
        return sum(e.pipeline.stored_bytes for e in self.entries)


class SpoolConverter:
    """Turns committed spool entries into recordings in ``store`` and deletes them from the spool."""

    def __init__(
        self,
        spool_dir: str | os.PathLike[str],
        store: Store,
        *,
        executable: str | None,
        recorder: RecorderInfo,
        on_commit: Callable[[], None] | None = None,
        before_write: Callable[[], None] | None = None,
        env: Mapping[str, str] | None = None,
    ):
        self.spool_dir = Path(spool_dir)
        self.env = dict(os.environ if env is None else env)  # the application's (where Triton's cache is)
        self.store = store
        self.executable = executable
        self.recorder = recorder
        self.stats = ConversionStats()
        self._writers: dict[int, RecordingWriter] = {}
        self._on_commit = on_commit
        self._before_write = before_write
        self._modules: dict[int, SpoolModule] = {}
        self._code: dict[tuple[int, str], KernelCodeFiles] = {}
        self._databases: dict[tuple[int, str], RecordingDatabase] = {}
        self._exe_fatbin: bytes | None | bool = False  # False: not read yet
        # Per device: (GPU digest, size) of every copied piece -> its chunks, for pieces later entries did not copy.
        self._digest_chunks: dict[int, dict[tuple[str, int], tuple[ChunkRef, ...]]] = {}

    # -- code -------------------------------------------------------------------------
    def _module(self, module_id: int) -> SpoolModule:
        if module_id not in self._modules:
            self._modules[module_id] = read_module(self.spool_dir, module_id)
        return self._modules[module_id]

    def _executable_fatbin(self) -> bytes | None:
        if self._exe_fatbin is False:
            self._exe_fatbin = fatbin.executable_fatbin(self.executable) if self.executable else None
        return self._exe_fatbin  # type: ignore[return-value]

    def code_for(self, entry: SpoolEntry) -> KernelCodeFiles:
        key = (entry.module_id, entry.kernel)
        if key in self._code:
            return self._code[key]
        if entry.module_id < 0:
            raise ArtifactError(f"{entry.kernel}: the recorder saw no module defining it; its code cannot be recorded")
        module = self._module(entry.module_id)
        arch = int(entry.arch[3:].rstrip("abf")) if entry.arch.startswith("sm_") else None
        ptx = None
        if module.source_kind == "ptx" and module.source and fatbin.ptx_defines(module.source, entry.kernel):
            ptx = module.source.decode("utf-8", "replace").rstrip("\0")
        elif module.source_kind == "fatbin" and module.source:
            ptx = fatbin.find_ptx(module.source, entry.kernel, arch)
        if ptx is None and self._executable_fatbin():
            ptx = fatbin.find_ptx(self._executable_fatbin(), entry.kernel, arch)  # type: ignore[arg-type]
        if ptx is None and module.source_kind in ("elf", ""):
            ptx = triton_cache.find_ptx((module.source or b"", module.cubin), entry.kernel, self.env)
        bitcode = fatbin.executable_bitcode(self.executable, entry.kernel) if self.executable else None
        files = KernelCodeFiles(ptx, module.cubin, bitcode)
        self._code[key] = files
        return files

    # -- databases --------------------------------------------------------------------
    def writer_for(self, device: int) -> RecordingWriter:
        """Device 0 records into the output itself, device d > 0 into ``device<d>/``.

        A database describes one address window, and every device has its own
        (base + d x size), so launches on different GPUs cannot share one.
        """
        if device not in self._writers:
            if device == 0:
                store = self.store
            elif isinstance(self.store, LocalStore):
                store = LocalStore(self.store.root / f"device{device}", durability=self.store.durability)
            else:
                store = open_store(f"{self.store.url.rstrip('/')}/device{device}")
            self._writers[device] = RecordingWriter(store)
        return self._writers[device]

    def _database(self, entry: SpoolEntry, code: KernelCodeFiles, params: tuple[KernelParam, ...]) -> RecordingDatabase:
        static = static_hash(entry.kernel, code.identity())
        key = (entry.device, static)
        if key in self._databases:
            return self._databases[key]
        writer = self.writer_for(entry.device)
        stored_code: KernelCode = writer.write_code(
            static, ptx=code.ptx, cubin=code.cubin, bitcode=code.bitcode, arch=entry.arch
        )
        space, _ = address_space(entry)
        cc = entry.arch[3:] if entry.arch.startswith("sm_") else "90"
        major, minor = (int(cc[:-1]), int(cc[-1])) if cc.isdigit() and len(cc) >= 2 else (9, 0)
        db = new_database(
            static,
            KernelSignature(entry.kernel, entry.demangled, params, len(entry.args)),
            stored_code,
            device=DeviceInfo(entry.device_name, (major, minor), entry.device),
            address_space=space,
            recorder=self.recorder,
        )
        if writer.store.exists(db.name):
            # Recording again into the same directory: continue the database there
            # (its signature and window stay; the commit checks the code matches).
            db = load_database(writer.store, db.name)
        self._databases[key] = db
        return db

    @staticmethod
    def _occurrence(db: RecordingDatabase, entry: SpoolEntry, attributes: tuple[LaunchAttribute, ...]) -> int:
        """How many recorded instances already have this launch shape, these argument bytes and attributes."""
        return sum(
            1
            for inst in db.instances.values()
            if inst.args == entry.args
            and inst.grid.as_tuple() == entry.grid
            and inst.block.as_tuple() == entry.block
            and inst.shared_mem == entry.shared_mem
            and attributes_key(inst.launch_attributes) == attributes_key(attributes)
        )

    # -- entries ----------------------------------------------------------------------
    def _write_snapshots(self, writer: RecordingWriter, entry: SpoolEntry, static: str, dyn: str, policies,
                         stats: PipelineStats) -> dict[str, ObjectRef]:
        """Store both phases' chunks through one thread pool (prologue pieces first), then their snapshot files.

        A region's pieces are whole multiples of the chunk size but the last, so
        chunking piece by piece equals chunking the region. Pieces the recorder
        did not copy (their GPU digest was captured before) take the chunks of
        the piece that digest names. Once the chunks are stored the entry's
        stripe files are deleted (:func:`release_stripes`).
        """
        sources, copied = [], []
        for phase in PHASES:
            for i, r in enumerate(entry.regions):
                for k, p in enumerate(r.pieces):
                    if r.copied(phase, k):
                        sources.append(FileSlice(entry.stripe_path(phase, p.stripe), p.offset, p.size))
                        copied.append((phase, i, k))
        piece_refs = dict(zip(copied, writer.put_chunks(sources, stats)))
        release_stripes(entry)
        started = time.perf_counter()
        seen = self._digest_chunks.setdefault(entry.device, {})
        for (phase, i, k), refs in piece_refs.items():
            digest = entry.regions[i].digest(phase, k)
            if digest:
                seen[(digest, entry.regions[i].pieces[k].size)] = tuple(refs)
        out = {}
        for phase in PHASES:
            regions = []
            for i, r in enumerate(entry.regions):
                chunks: list[ChunkRef] = []
                for k, p in enumerate(r.pieces):
                    if r.copied(phase, k):
                        chunks += piece_refs[(phase, i, k)]
                        continue
                    refs = seen.get((r.digest(phase, k), p.size))
                    if refs is None:
                        raise ArtifactError(
                            f"spool entry {entry.path}: {phase} piece {k} of region {r.base:#x} was not copied, and no "
                            f"earlier piece has its digest {r.digest(phase, k)}; the recorder and the agent disagree"
                        )
                    chunks += refs
                    stats.add(unchanged_bytes=p.size)
                regions.append(Region(r.base, r.size, r.kind, region_name(r.kind, r.name, r.base), tuple(chunks),
                                      policies[r.base], r.array))
            name, sha, size = write_snapshot(writer.store, build_snapshot(static, dyn, phase, regions, writer.chunk_size))
            out[phase] = ObjectRef(name, sha, size)
        stats.add(snapshot_s=time.perf_counter() - started)
        return out

    @staticmethod
    def _empty_snapshots(writer: RecordingWriter, static: str, dyn: str) -> dict[str, ObjectRef]:
        """Snapshots without regions, for an instance the recorder abandoned (replay refuses it before reading them)."""
        out = {}
        for phase in PHASES:
            name, sha, size = write_snapshot(writer.store, build_snapshot(static, dyn, phase, (), writer.chunk_size))
            out[phase] = ObjectRef(name, sha, size)
        return out

    def convert(self, path: Path) -> str:
        """Convert one committed entry; returns the database name. The entry is deleted afterwards."""
        started = time.monotonic()
        entry = read_entry(path)
        code = self.code_for(entry)
        pointers = pointer_offsets(entry.args, entry)
        db = self._database(entry, code, kernel_params(entry, pointers))
        _, space_warnings = address_space(entry)
        warnings = list(entry.warnings) + space_warnings
        if code.ptx is None:
            warnings.append("no PTX found for this kernel (module without embedded PTX?): only the recorded cubin can be replayed")

        policies = {}
        for r in entry.regions:
            try:
                policies[r.base] = verify_policy(r.policy)
            except ArtifactError as exc:
                policies[r.base] = None
                warnings.append(f"ignored the verification policy of {region_name(r.kind, r.name, r.base)}: {exc}")
        if self._before_write:
            self._before_write()
        writer = self.writer_for(entry.device)
        attributes = launch_attributes(entry)
        occurrence = self._occurrence(db, entry, attributes)
        dyn = dynamic_hash(
            db.static_hash, entry.grid, entry.block, entry.shared_mem, entry.args, occurrence, attributes_key(attributes)
        )
        stats = PipelineStats()
        textures = TexturePlan()
        if entry.abandoned:
            refs = self._empty_snapshots(writer, db.static_hash, dyn)
            unsupported = (abandoned_reason(entry),)
        else:
            textures = self._textures(entry, code.ptx, writer)
            warnings += textures.warnings
            refs = self._write_snapshots(writer, textures.stored(entry), db.static_hash, dyn, policies, stats)
            unsupported = unsupported_reasons(entry, attributes, textures.unsupported)
        instance = InstanceRecord(
            dyn, Dim3(*entry.grid), Dim3(*entry.block), entry.shared_mem, entry.args,
            refs["prologue"], refs["epilogue"], tuple(sorted(pointers)), entry.launch_index, occurrence,
            None, tuple(dict.fromkeys(warnings)), attributes, unsupported, textures.records if not unsupported else (),
        )  # fmt: skip
        # Snapshots and chunks are stored: now the database (merged with what is there).
        committing = time.perf_counter()
        db = writer.commit(db.add_instance(instance))
        stats.add(commit_s=time.perf_counter() - committing)
        self._databases[(entry.device, db.static_hash)] = db
        self.stats.instances += 1
        self.stats.bytes += 2 * sum(r.size for r in entry.regions)
        self.stats.databases.add(db.name if entry.device == 0 else f"device{entry.device}/{db.name}")
        self.stats.kernels.add(entry.kernel)
        if entry.abandoned:
            self.stats.abandoned.append((entry.kernel, entry.abandoned))
        else:
            self.stats.entries.append(_entry_stats(entry, stats, started))
        shutil.rmtree(path, ignore_errors=True)
        if self._on_commit:
            self._on_commit()
        return db.name

    def _textures(self, entry: SpoolEntry, ptx: str | None, writer: RecordingWriter) -> TexturePlan:
        """The entry's texture and surface objects the launch reaches (``record_agent.textures``); a piece of
        captured memory the recorder left out is read from the chunks of the earlier piece with its digest."""
        seen = self._digest_chunks.get(entry.device, {})

        def earlier(digest: str, size: int) -> bytes | None:
            refs = seen.get((digest, size))
            return None if refs is None else read_chunks(writer.store, refs)

        return plan_textures(entry, ptx, lambda region: region_bytes(entry, region, "prologue", earlier))

    def convert_ready(self, progress: Callable[[int, int], None] | None = None) -> int:
        """Convert every committed entry now in the spool; returns how many."""
        done = 0
        for path in entries_in_order(self.spool_dir):
            captured = len(self.stats.entries)
            self.convert(path)
            done += 1
            if progress:
                progress(done, self.stats.entries[-1].snapshot_bytes if len(self.stats.entries) > captured else 0)
        return done


def abandoned_reason(entry: SpoolEntry) -> str:
    """The ``unsupported`` reason of an instance the recorder abandoned at a deadline."""
    return (
        f"the recorder abandoned this launch: {entry.abandoned}; its snapshots were not taken, so it cannot be "
        "replayed (docs/recording.md, Threads and deadlines)"
    )


def release_stripes(entry: SpoolEntry) -> None:
    """Delete an entry's stripe files once their pieces are stored.

    What the database commit then makes durable under ``--durable`` (one ``syncfs`` of the file
    system) no longer includes the spool's copy of the snapshot, which shares
    the file system with the recording wherever both are under ``/tmp``, and
    the recorder's back-pressure is relieved at once. Nothing is lost: a spool
    is never converted again after its agent ends.
    """
    for stripe in entry.path.glob("*.bin"):
        try:
            stripe.unlink()
        except OSError:
            pass  # deleted with the entry directory afterwards


def _entry_stats(entry: SpoolEntry, pipeline: PipelineStats, started: float) -> EntryStats:
    raw = entry.raw
    epilogue_bytes = int(raw.get("epilogue_bytes", entry.prologue_bytes))
    copied = int(raw.get("prologue_copied_bytes", entry.prologue_bytes)) + int(raw.get("epilogue_copied_bytes", epilogue_bytes))
    now = time.monotonic()
    return EntryStats(
        seq=entry.seq, kernel=entry.kernel, snapshot_bytes=entry.prologue_bytes + epilogue_bytes, copied_bytes=copied,
        stall_s=entry.prologue_seconds + entry.epilogue_seconds, prologue_s=entry.prologue_seconds,
        epilogue_s=entry.epilogue_seconds,
        spool_write_s=float(raw.get("prologue_write_seconds", 0.0)) + float(raw.get("epilogue_write_seconds", 0.0)),
        spool_wait_s=float(raw.get("spool_wait_seconds", 0.0)),
        digest_s=float(raw.get("prologue_digest_seconds", 0.0)) + float(raw.get("epilogue_digest_seconds", 0.0)),
        converted_at=now, convert_s=now - started, pipeline=pipeline, snapshot_scope=entry.snapshot_scope,
        pool_allocator=entry.pool_allocator,
    )  # fmt: skip
