"""Whole-recording integrity: is every object a database names present and intact?

Used after an upload (before a database is trusted), by ``mneme`` commands
that check or garbage-collect a store, and by tests. Problems are collected,
not raised one by one, so a user sees everything that is wrong at once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from mneme.errors import ArtifactError
from mneme.format.chunks import ChunkRef, read_chunks
from mneme.format.database import RecordingDatabase, find_databases, load_database
from mneme.format.hashing import static_hash
from mneme.format.snapshot import Snapshot, read_snapshot
from mneme.store.base import Store


@dataclass
class VerificationReport:
    """What ``verify_recording`` checked and what it found wrong."""

    database: str
    objects_checked: int = 0
    chunks_checked: int = 0
    bytes_checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_for_problems(self) -> None:
        """Raise ArtifactError listing every problem (no-op when the recording is intact)."""
        if self.problems:
            shown = "\n  ".join(self.problems[:20])
            more = f"\n  ... and {len(self.problems) - 20} more" if len(self.problems) > 20 else ""
            raise ArtifactError(f"{self.database}: {len(self.problems)} problem(s):\n  {shown}{more}")


def verify_recording(store: Store, database: str, *, deep: bool = True) -> VerificationReport:
    """Check recording ``database`` in ``store``.

    Shallow: the database parses, every object it names exists with the
    recorded size, snapshots parse and belong to their instance, every chunk
    exists. Deep (the default) also checks SHA-256 of every file, decompresses
    and hashes every chunk (each distinct chunk once), and checks the static
    hash against the recorded code.

    Args:
        store: the store.
        database: the database's object name.
        deep: also hash every file and chunk.

    Returns:
        The ``VerificationReport``; its ``problems`` are empty when the recording is whole.
    """
    report = VerificationReport(f"{database} in {store.url}")
    try:
        db = load_database(store, database)
    except ArtifactError as exc:
        report.problems.append(str(exc))
        return report
    for kind, ref in db.code.refs().items():
        data = _check_object(store, ref.path, ref.size, ref.sha256 if deep else None, report)
        if deep and data is not None and kind == ("ptx" if db.code.ptx else "cubin"):
            actual = static_hash(db.kernel.name, data)
            if actual != db.static_hash:
                report.problems.append(f"the {kind} of {db.kernel.name} hashes to {actual}, not {db.static_hash}")
    chunks: set[ChunkRef] = set()
    for dyn, inst in db.instances.items():
        for phase, ref in (("prologue", inst.prologue), ("epilogue", inst.epilogue)):
            if _check_object(store, ref.path, ref.size, None, report) is None:
                continue
            try:
                snapshot = read_snapshot(store, ref.path, sha256=ref.sha256 if deep else None, size=ref.size)
            except ArtifactError as exc:
                report.problems.append(str(exc))
                continue
            if (snapshot.static_hash, snapshot.dynamic_hash, snapshot.phase) != (db.static_hash, dyn, phase):
                report.problems.append(
                    f"{ref.path} holds the {snapshot.phase} of {snapshot.static_hash}/{snapshot.dynamic_hash}, "
                    f"expected the {phase} of {db.static_hash}/{dyn}"
                )
            chunks |= snapshot.chunk_refs()
    for ref in sorted(chunks):
        report.chunks_checked += 1
        if not store.exists(ref.name):
            report.problems.append(f"chunk {ref.name} is missing")
        elif deep:
            try:
                read_chunks(store, [ref], what=database)
                report.bytes_checked += ref.length
            except ArtifactError as exc:
                report.problems.append(str(exc))
    return report


def _check_object(store: Store, name: str, size: int, sha256: str | None, report: VerificationReport) -> bytes | None:
    report.objects_checked += 1
    if not store.exists(name):
        report.problems.append(f"{name} is missing")
        return None
    actual = store.size(name)
    if actual != size:
        report.problems.append(f"{name} has {actual} bytes, the database says {size}")
        return None
    if sha256 is None:
        return b""
    data = store.get(name)
    report.bytes_checked += len(data)
    if hashlib.sha256(data).hexdigest() != sha256:
        report.problems.append(f"{name} does not match its SHA-256 in the database")
        return None
    return data


def recording_objects(store: Store, db: RecordingDatabase) -> set[str]:
    """Every object name recording ``db`` uses: the database, code, snapshots and their chunks.

    Reads the snapshot files (not the chunks). Garbage collection keeps the
    union of this over all databases of a store.
    """
    names = {db.name}
    names |= {ref.path for ref in db.referenced_objects()}
    for inst in db.instances.values():
        for ref in (inst.prologue, inst.epilogue):
            snapshot: Snapshot = read_snapshot(store, ref.path)
            names |= {c.name for c in snapshot.chunk_refs()}
    return names


def live_objects(store: Store) -> set[str]:
    """The objects used by any recording in ``store`` (top-level databases)."""
    names: set[str] = set()
    for database in find_databases(store):
        names |= recording_objects(store, load_database(store, database))
    return names
