"""The recorded-execution view: a recording database and its launches, as the replay and the tuner see them.

``RecordedExecution.from_json("dir/<static>.json")`` (or an ``s3://`` URL)
opens a recording; ``rec[record_id]`` gives a :class:`KernelInstance` with the
launch shape the reference exposes (``grid_dim.x``, ``block_dim.y``,
``shared_mem``) plus what a replay needs (argument bytes, snapshots, code).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

from mneme.errors import ArtifactError, UnsupportedInstanceError
from mneme.format.database import (
    AddressSpace,
    DeviceInfo,
    InstanceRecord,
    KernelCode,
    KernelSignature,
    LaunchAttribute,
    RecordingDatabase,
    load_database,
)
from mneme.format.hashing import static_hash as compute_static_hash
from mneme.format.objects import ObjectRef
from mneme.format.snapshot import Snapshot, read_snapshot
from mneme.model.experiment import Dim3
from mneme.store import Store, split_recording_url

CODE_KINDS = ("ptx", "cubin", "bitcode")


@dataclass(frozen=True)
class KernelInstance:
    """One recorded launch of the kernel (a dynamic instance), bound to its store.

    Attributes:
        record_id: the instance's dynamic hash (``--record-id``).
        kernel_name: the kernel's mangled name.
        grid_dim, block_dim: the recorded launch's extents.
        shared_mem: the recorded dynamic shared memory in bytes.
        arguments: the exact parameter bytes, laid out as the kernel's signature says.
        pointer_args: offsets of the argument words that point into recorded memory.
        prologue, epilogue: the names of the snapshot files before and after the launch.
        code: the kernel's code files (PTX, cubin, bitcode).
        record: the database's record of the instance (``mneme.format.InstanceRecord``).
        recording: the recording the instance belongs to.
    """

    record_id: str
    kernel_name: str
    grid_dim: Dim3
    block_dim: Dim3
    shared_mem: int
    arguments: bytes
    pointer_args: tuple[int, ...]
    prologue: str
    epilogue: str
    code: KernelCode
    record: InstanceRecord
    recording: "RecordedExecution"

    @property
    def dynamic_hash(self) -> str:
        """The instance's dynamic hash (the same as ``record_id``)."""
        return self.record_id

    @property
    def static_hash(self) -> str:
        """The kernel's static hash."""
        return self.recording.static_hash

    @property
    def signature(self) -> KernelSignature:
        """The kernel's parameter layout."""
        return self.recording.kernel

    @property
    def address_space(self) -> AddressSpace:
        """Where the recorded memory lay (``fixed`` window or ``relocatable``)."""
        return self.recording.address_space

    @property
    def launch_index(self) -> int:
        """The launch's position among all launches the recorder saw."""
        return self.record.launch_index

    @property
    def app_kernel_time_ns(self) -> int | None:
        """The kernel time measured in the application, if the recorder knew it."""
        return self.record.app_kernel_time_ns

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the recorder could not capture faithfully."""
        return self.record.warnings

    @property
    def textures(self) -> tuple:
        """The texture and surface objects the launch reaches (``mneme.format.textures.TextureObject``)."""
        return self.record.textures

    @property
    def supported(self) -> bool:
        """False when the recorder knew it could not capture this launch faithfully (see ``unsupported``)."""
        return self.record.supported

    @property
    def unsupported(self) -> tuple[str, ...]:
        """Why the launch cannot be replayed (memory the recorder does not capture, ...); empty when it can."""
        return self.record.unsupported

    def require_supported(self) -> None:
        """Raise :class:`UnsupportedInstanceError` with the recorder's reasons for an instance it could not capture."""
        if self.record.unsupported:
            raise UnsupportedInstanceError(
                f"instance {self.record_id} of {self.kernel_name} cannot be replayed: the recorder could not capture "
                f"it faithfully ({'; '.join(self.record.unsupported)}). Choose another instance (mneme ls shows which "
                "are supported) or change the application so the kernel uses memory the recorder captures"
            )

    @property
    def launch_attributes(self) -> tuple[LaunchAttribute, ...]:
        """The launch attributes the application launched with (cluster dimensions, cooperative, ...)."""
        return self.record.launch_attributes

    def load_prologue(self) -> Snapshot:
        """The memory before the launch (header only; region bytes are read on demand, verified).

        Returns:
            The snapshot.

        Raises:
            ArtifactError: the file is damaged, or holds another instance's or phase's memory.
        """
        return self._load(self.record.prologue, "prologue")

    def load_epilogue(self) -> Snapshot:
        """The memory after the launch.

        Returns:
            The snapshot (header only, as ``load_prologue``).

        Raises:
            ArtifactError: as ``load_prologue``.
        """
        return self._load(self.record.epilogue, "epilogue")

    def _load(self, ref: ObjectRef, phase: str) -> Snapshot:
        snapshot = read_snapshot(self.recording.store, ref.path, sha256=ref.sha256, size=ref.size)
        if (snapshot.static_hash, snapshot.dynamic_hash, snapshot.phase) != (self.static_hash, self.record_id, phase):
            raise ArtifactError(
                f"snapshot {ref.path} in {self.recording.store.url} holds the {snapshot.phase} of "
                f"{snapshot.static_hash}/{snapshot.dynamic_hash}, not the {phase} of "
                f"{self.static_hash}/{self.record_id}; the recording directory is inconsistent"
            )
        return snapshot

    def load_code(self, kind: str) -> bytes:
        """The bytes of a code file (``ptx``, ``cubin`` or ``bitcode``), verified.

        Args:
            kind: ``ptx``, ``cubin`` or ``bitcode``.

        Returns:
            The file's bytes.
        """
        return self.recording.load_code(kind)

    def __repr__(self) -> str:
        return (
            f"KernelInstance({self.kernel_name} {self.record_id}: grid={self.grid_dim.as_tuple()}, "
            f"block={self.block_dim.as_tuple()}, shared_mem={self.shared_mem})"
        )


class RecordedExecution:
    """A recording database (one static kernel) and its dynamic instances.

    Args:
        store: the store holding the database and what it names.
        database_name: the database's object name in the store.
        database: the database, read (``mneme.format.load_database``).
    """

    KernelInstance = KernelInstance

    def __init__(self, store: Store, database_name: str, database: RecordingDatabase):
        self.store = store
        self.database_name = database_name
        self.database = database
        self._instances = {
            key: _instance(self, record) for key, record in database.instances.items()
        }
        self._code_cache: dict[str, bytes] = {}

    # -- opening ------------------------------------------------------------------
    @classmethod
    def from_json(cls, path_or_url: str | os.PathLike[str]) -> "RecordedExecution":
        """Open ``dir/<static>.json`` or ``s3://bucket/prefix/<static>.json`` (or a directory holding one database).

        Args:
            path_or_url: the database file, its ``s3://`` URL, or a directory holding one database.

        Returns:
            The recording.

        Raises:
            ArtifactError: no database there, or a damaged one.
        """
        store, name = split_recording_url(path_or_url)
        return cls.from_store(store, name)

    @classmethod
    def from_store(cls, store: Store, name: str) -> "RecordedExecution":
        """Open the database ``name`` of ``store``.

        Args:
            store: the store.
            name: the database's object name (``<static>.json``).

        Returns:
            The recording.
        """
        return cls(store, name, load_database(store, name))

    # -- the kernel ----------------------------------------------------------------
    @property
    def static_hash(self) -> str:
        """The kernel's static hash."""
        return self.database.static_hash

    @property
    def kernel(self) -> KernelSignature:
        """The kernel's signature: name and parameter layout."""
        return self.database.kernel

    @property
    def kernel_name(self) -> str:
        """The kernel's mangled name."""
        return self.database.kernel.name

    @property
    def code(self) -> KernelCode:
        """The kernel's stored code files (PTX, cubin, bitcode)."""
        return self.database.code

    @property
    def device(self) -> DeviceInfo:
        """The GPU the kernel was recorded on."""
        return self.database.device

    @property
    def address_space(self) -> AddressSpace:
        """Where the recorded memory lay (``fixed`` window or ``relocatable``)."""
        return self.database.address_space

    @property
    def path(self) -> str:
        """The database as a path or URL (what ``-rdb`` takes)."""
        return f"{self.store.url.rstrip('/')}/{self.database_name}"

    def load_code(self, kind: str) -> bytes:
        """A code file's bytes (``ptx``, ``cubin``, ``bitcode``), verified against the database, cached.

        Args:
            kind: ``ptx``, ``cubin`` or ``bitcode``.

        Returns:
            The file's bytes.

        Raises:
            ArtifactError: the recording has no such file, or it does not match the database.
        """
        if kind not in CODE_KINDS:
            raise ArtifactError(f"unknown code kind {kind!r}; use one of {', '.join(CODE_KINDS)}")
        if kind not in self._code_cache:
            ref = getattr(self.code, kind)
            if ref is None:
                have = ", ".join(self.code.refs()) or "none"
                raise ArtifactError(f"{self.path}: no {kind} was recorded for kernel {self.kernel_name} (have: {have})")
            self._code_cache[kind] = ref.read(self.store, f"{kind} file")
        return self._code_cache[kind]

    def check_static_hash(self) -> None:
        """Check that the recorded code hashes to the static hash (PTX if recorded, else cubin)."""
        kind = "ptx" if self.code.ptx is not None else "cubin"
        actual = compute_static_hash(self.kernel_name, self.load_code(kind))
        if actual != self.static_hash:
            raise ArtifactError(
                f"{self.path}: the recorded {kind} of {self.kernel_name} hashes to {actual}, not {self.static_hash}"
            )

    # -- the instances ---------------------------------------------------------------
    @property
    def instances(self) -> dict[str, KernelInstance]:
        """The instances by record id (a new dict)."""
        return dict(self._instances)

    def __getitem__(self, record_id: str) -> KernelInstance:
        try:
            return self._instances[str(record_id)]
        except KeyError:
            raise ArtifactError(
                f"no instance {record_id} in {self.path}; recorded instances: {self._known_ids()}"
            ) from None

    def __contains__(self, record_id: object) -> bool:
        return str(record_id) in self._instances

    def __len__(self) -> int:
        return len(self._instances)

    def __iter__(self) -> Iterator[str]:
        return iter(self._instances)

    def keys(self):
        """The record ids, as a dict's keys.

        Returns:
            A view of the ids.
        """
        return self._instances.keys()

    def values(self):
        """The instances, as a dict's values.

        Returns:
            A view of the instances.
        """
        return self._instances.values()

    def items(self):
        """``(record id, instance)`` pairs, as a dict's items.

        Returns:
            A view of the pairs.
        """
        return self._instances.items()

    def select(self, record_id: str | None = None) -> KernelInstance:
        """The instance a command works on: ``record_id``'s, or the only one when it is None.

        Every command that takes ``-rdb`` (and its optional ``--record-id``)
        resolves its instance here: with several instances and no id, the
        error lists the choices (id, grid, block) and says to pass
        ``--record-id``; an unknown id lists the recorded ones.

        Args:
            record_id: the instance's id; None or '' for the only one.

        Returns:
            The instance.

        Raises:
            ArtifactError: several instances and no id, none at all, or an unknown id.
        """
        if record_id not in (None, ""):
            return self[record_id]
        if len(self._instances) == 1:
            return next(iter(self._instances.values()))
        if not self._instances:
            raise ArtifactError(f"{self.path} holds no recorded instances; record the kernel again")
        raise ArtifactError(
            f"{self.path} holds {len(self._instances)} instances; choose one with --record-id ID "
            f"(-rid ID; in Python, select(ID)). Recorded instances:\n{self._choices()}"
        )

    def single_instance(self) -> KernelInstance:
        """The only instance; an error listing the ids when there are several or none (``select(None)``).

        Returns:
            The instance.

        Raises:
            ArtifactError: as ``select(None)``.
        """
        return self.select(None)

    def _choices(self, limit: int = 20) -> str:
        """One line per instance (id, launch index, grid, block), at most ``limit``."""
        rows = sorted(self._instances.values(), key=lambda i: (i.record.launch_index, i.record_id))
        lines = [
            f"  {i.record_id}  launch {i.record.launch_index}  grid {i.grid_dim.as_tuple()}  block {i.block_dim.as_tuple()}"
            for i in rows[:limit]
        ]
        if len(rows) > limit:
            lines.append(f"  ... and {len(rows) - limit} more (`mneme ls` lists them all)")
        return "\n".join(lines)

    def _known_ids(self) -> str:
        ids = list(self._instances)
        if not ids:
            return "none"
        shown = ", ".join(ids[:20])
        return shown + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")

    def __repr__(self) -> str:
        return f"RecordedExecution({self.path!r}, kernel={self.kernel_name}, instances={len(self)})"


def _instance(recording: RecordedExecution, record: InstanceRecord) -> KernelInstance:
    return KernelInstance(
        record_id=record.dynamic_hash,
        kernel_name=recording.database.kernel.name,
        grid_dim=record.grid,
        block_dim=record.block,
        shared_mem=record.shared_mem,
        arguments=record.args,
        pointer_args=record.pointer_args,
        prologue=record.prologue.path,
        epilogue=record.epilogue.path,
        code=recording.database.code,
        record=record,
        recording=recording,
    )
