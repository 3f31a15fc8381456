"""Writing recordings: chunks first, then snapshot files and code, the database last.

Producers (the record agent, synthetic fixtures, tests) go through
:class:`RecordingWriter` so that the commit order is always the same: a reader
that finds a database can rely on every object it names being complete.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

from mneme.errors import ArtifactError
from mneme.format.capture import ContentIndex, PipelineStats
from mneme.format.chunks import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_LEVEL,
    ChunkRef,
    ChunkSource,
    FileSlice,
    put_many,
)
from mneme.format.content_hash import DEFAULT_CHUNK_HASH, check_algorithm
from mneme.format.database import (
    AddressSpace,
    DeviceInfo,
    InstanceRecord,
    KernelCode,
    KernelSignature,
    RecorderInfo,
    RecordingDatabase,
    load_database,
    merge_databases,
    save_database,
)
from mneme.format.hashing import dynamic_hash
from mneme.format.layout import bitcode_name, cubin_name, database_name, ptx_name
from mneme.format.objects import ObjectRef
from mneme.format.policy import VerifyPolicy
from mneme.format.snapshot import Region, build_snapshot, write_snapshot
from mneme.model.experiment import Dim3
from mneme.store.base import Store

#: How often a database commit re-reads and retries when another writer raced it.
COMMIT_ATTEMPTS = 5


@dataclass(frozen=True)
class RegionSource:
    """A region to snapshot: its address, kind, name and where its bytes are.

    Give the bytes either as ``data`` or as ``path`` (a raw file, read from
    ``offset``; ``size`` defaults to the rest of the file).
    """

    base: int
    kind: str
    name: str = ""
    data: bytes | bytearray | memoryview | None = None
    path: str | os.PathLike[str] | None = None
    offset: int = 0
    size: int | None = None
    policy: VerifyPolicy | None = None


class RecordingWriter:
    """Writes recordings of one or more kernels into a store (a recording directory).

    It remembers the fingerprints of the chunks it stored (``index``), so bytes
    that later snapshots repeat cost no hashing, and adds up what storing cost
    (``stats``). ``chunk_hash`` names its chunks: ``"blake3"`` (the default:
    version 2 snapshots) or ``"sha256"`` (version 1, as older mneme wrote).
    """

    def __init__(
        self,
        store: Store,
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        level: int = DEFAULT_LEVEL,
        chunk_hash: str = DEFAULT_CHUNK_HASH,
    ):
        self.store = store
        self.chunk_size = chunk_size
        self.level = level
        self.chunk_hash = check_algorithm(chunk_hash)
        self.index = ContentIndex()
        self.stats = PipelineStats()

    def put_chunks(self, sources: Sequence[ChunkSource], stats: PipelineStats | None = None) -> list[list[ChunkRef]]:
        """Store the sources' chunks through one thread pool; refs per source. ``stats`` also gets the costs."""
        call = PipelineStats()
        refs = put_many(self.store, sources, self.chunk_size, level=self.level, index=self.index, stats=call,
                        algorithm=self.chunk_hash)
        self.stats.merge(call)
        if stats is not None:
            stats.merge(call)
        return refs

    # -- code ---------------------------------------------------------------------
    def write_code(
        self,
        static_hash: str,
        *,
        ptx: str | bytes | None = None,
        cubin: bytes | None = None,
        bitcode: bytes | None = None,
        arch: str = "sm_90",
    ) -> KernelCode:
        """Store the kernel's code files (once: an identical existing file is kept)."""
        if ptx is None and cubin is None:
            raise ArtifactError(f"kernel {static_hash}: record at least its PTX or its cubin")
        if isinstance(ptx, str):
            ptx = ptx.encode("utf-8")
        recorded = self.store.exists(database_name(static_hash))
        refs = {}
        for kind, name, data in (
            ("ptx", ptx_name(static_hash), ptx),
            ("cubin", cubin_name(static_hash), cubin),
            ("bitcode", bitcode_name(static_hash), bitcode),
        ):
            refs[kind] = None if data is None else self._put_code(name, bytes(data), recorded)
        return KernelCode(refs["ptx"], refs["cubin"], refs["bitcode"], arch)

    def _put_code(self, name: str, data: bytes, recorded: bool) -> ObjectRef:
        """Store a code file unless the same bytes are there; never replace one a database names."""
        ref = ObjectRef.of(name, data)
        if self.store.exists(name):
            if self.store.get(name) == data:
                return ref
            if recorded:
                raise ArtifactError(
                    f"{name} in {self.store.url} holds different code for the same kernel "
                    "(same PTX, a cubin built with other flags?); record into a fresh directory"
                )
        self.store.put(name, data)
        return ref

    # -- snapshots ------------------------------------------------------------------
    def store_regions(self, sources: Sequence[RegionSource]) -> list[Region]:
        """Store the regions' chunks (all pieces through one thread pool); return the Regions."""
        payloads = []
        for src in sources:
            if (src.data is None) == (src.path is None):
                raise ArtifactError(f"region {src.name or hex(src.base)}: give exactly one of data and path")
            payloads.append(src.data if src.data is not None else FileSlice(src.path, src.offset, src.size))
        refs = self.put_chunks(payloads)
        return [
            Region(src.base, sum(c.length for c in chunks), src.kind, src.name, tuple(chunks), src.policy)
            for src, chunks in zip(sources, refs)
        ]

    def store_region(self, source: RegionSource) -> Region:
        """Store one region's chunks; return the Region that references them."""
        return self.store_regions([source])[0]

    def write_snapshot(
        self, static_hash: str, dynamic: str, phase: str, regions: Sequence[RegionSource]
    ) -> ObjectRef:
        """Store the regions' chunks, then the snapshot file; return its reference."""
        snapshot = build_snapshot(static_hash, dynamic, phase, self.store_regions(regions), self.chunk_size)
        name, sha, size = write_snapshot(self.store, snapshot)
        return ObjectRef(name, sha, size)

    # -- instances and the database ---------------------------------------------------
    def write_instance(
        self,
        db: RecordingDatabase,
        *,
        grid: Any,
        block: Any,
        shared_mem: int,
        args: bytes,
        prologue: Sequence[RegionSource],
        epilogue: Sequence[RegionSource],
        pointer_args: Sequence[int] = (),
        launch_index: int = 0,
        occurrence: int = 0,
        app_kernel_time_ns: int | None = None,
        warnings: Sequence[str] = (),
        commit: bool = True,
    ) -> tuple[RecordingDatabase, InstanceRecord]:
        """Store one launch (snapshots first) and add it to ``db``.

        With ``commit`` (the default) the database is merged into the stored one
        and saved; otherwise call :meth:`commit` after the last instance.
        Returns the updated database and the new instance.
        """
        grid, block = _dim3(grid), _dim3(block)
        args = bytes(args)
        dyn = dynamic_hash(db.static_hash, grid, block, shared_mem, args, occurrence)
        prologue_ref = self.write_snapshot(db.static_hash, dyn, "prologue", prologue)
        epilogue_ref = self.write_snapshot(db.static_hash, dyn, "epilogue", epilogue)
        instance = InstanceRecord(
            dyn, grid, block, shared_mem, args, prologue_ref, epilogue_ref,
            tuple(sorted(pointer_args)), launch_index, occurrence, app_kernel_time_ns, tuple(warnings),
        )  # fmt: skip
        db = db.add_instance(instance)
        if commit:
            db = self.commit(db)
        return db, instance

    def commit(self, db: RecordingDatabase) -> RecordingDatabase:
        """Merge ``db`` into the stored database of its kernel (if any) and save it atomically.

        After saving, the database is read back; if another writer replaced it in
        between (another rank recording the same kernel into the same directory),
        the merge is redone, up to ``COMMIT_ATTEMPTS`` times.
        """
        db.validate()
        # A store that makes objects durable in batches (LocalStore "commit": `mneme record --durable`): every
        # chunk and snapshot the database names is on disk before it is, and then the database itself.
        self.store.make_durable()
        for _ in range(COMMIT_ATTEMPTS):
            merged = db
            if self.store.exists(db.name):
                merged = merge_databases(load_database(self.store, db.name), db)
            save_database(self.store, merged)
            stored = load_database(self.store, db.name)
            if all(stored.instances.get(k) == v for k, v in db.instances.items()):
                self.store.make_durable(db.name)
                return stored
        raise ArtifactError(
            f"{db.name} in {self.store.url}: other writers kept replacing the database; "
            "record each process into its own directory"
        )


def _dim3(value: Any) -> Dim3:
    """A Dim3 from a Dim3, a dict, a sequence or a plain integer (x only)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return Dim3(value)
    return Dim3.from_value(value)


def new_database(
    static_hash: str,
    kernel: KernelSignature,
    code: KernelCode,
    *,
    device: DeviceInfo | None = None,
    address_space: AddressSpace | None = None,
    recorder: RecorderInfo | None = None,
) -> RecordingDatabase:
    """An empty database for a kernel whose code is already stored (see ``RecordingWriter.write_code``).

    Args:
        static_hash: the kernel's static hash.
        kernel: its signature (name, parameters).
        code: its stored code files.
        device: the GPU it was recorded on.
        address_space: where its memory lay (``fixed`` window or ``relocatable``).
        recorder: what recorded it.

    Returns:
        The empty ``RecordingDatabase``.
    """
    return RecordingDatabase(
        static_hash,
        kernel,
        code,
        device or DeviceInfo(),
        address_space or AddressSpace(),
        recorder or RecorderInfo(),
        {},
    )


__all__ = ["COMMIT_ATTEMPTS", "RecordingWriter", "RegionSource", "new_database"]
