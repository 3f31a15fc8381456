"""``mneme check``: is every object the recordings of a store name present and intact?

Two depths, as ``restic check`` and ``borg check`` have:

* **structural** (the default): every database parses (and matches its
  checksum), every snapshot manifest is read and checked against the SHA-256
  and size its database records, every code file and chunk exists, code files
  with the recorded size. One listing of the store gives the sizes, so the
  cost is a few requests per thousand objects plus one GET per manifest:
  cheap enough for large S3 stores.
* **read-data**: also reads every chunk (decompressed, hashed, compared with
  its name and the length its snapshot records) and every code file
  (SHA-256 against the database; the PTX or cubin also against the kernel's
  static hash). Each distinct chunk is read once, however many recordings
  share it, on ``workers`` threads with at most ``2 * workers`` objects in
  memory.

Damage is collected, not raised: the report names every damaged object, the
recordings that use it, and the problem. ``mneme push --repair`` replaces
damaged objects from a good copy. A recording whose database was deleted or
replaced while the check ran (a concurrent ``clean`` or push) is not judged:
its objects may have changed under the check.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

from mneme.errors import ArtifactError
from mneme.format.chunks import ChunkRef
from mneme.format.database import RecordingDatabase, parse_database_bytes
from mneme.format.hashing import static_hash
from mneme.format.objects import ObjectRef
from mneme.format.snapshot import Snapshot, decode_snapshot
from mneme.store import Store
from mneme.store.base import ObjectInfo
from mneme.store.contents import (
    Location,
    chunk_problem,
    existing_store,
    list_info,
    object_info,
    select_databases,
)
from mneme.store.parallel import Progress, bounded_parallel
from mneme.store.retry import RetryPolicy, with_retries

DEFAULT_WORKERS = 8
#: How many recordings a damage line names before "and N more".
SHOWN_RECORDINGS = 3


@dataclass
class Damage:
    """One damaged (missing, resized, corrupt) object and the recordings that need it."""

    object: str
    problem: str
    recordings: list[str] = field(default_factory=list)

    def line(self) -> str:
        """``123.json: chunks/ab/ab12...: <problem>``; a shared object names up to three recordings, a database
        only itself (``123.json: <problem>``)."""
        if self.recordings == [self.object]:  # the database itself
            return f"{self.object}: {self.problem}"
        names = self.recordings[:SHOWN_RECORDINGS]
        more = len(self.recordings) - len(names)
        who = ", ".join(names) + (f" and {more} more" if more else "")
        return f"{who}: {self.object}: {self.problem}"


@dataclass
class CheckReport:
    """What :func:`check_store` checked and the damage it found."""

    store: str
    read_data: bool
    recordings: list[str] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)
    #: Recordings whose database was deleted or replaced while the check ran: not judged.
    changed: list[str] = field(default_factory=list)
    objects_checked: int = 0
    chunks_checked: int = 0
    bytes_read: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when no damage was found."""
        return not self.damage

    @property
    def damaged_recordings(self) -> list[str]:
        """The recordings that use at least one damaged object, sorted."""
        return sorted({r for d in self.damage for r in d.recordings})

    def lines(self) -> list[str]:
        """One line per damaged object (see :meth:`Damage.line`)."""
        return [d.line() for d in self.damage]

    def summary(self) -> str:
        depth = "read-data" if self.read_data else "structural"
        found = (f"{len(self.damage)} damaged object(s) in {len(self.damaged_recordings)} recording(s)"
                 if self.damage else "no damage")
        changed = (f"; {len(self.changed)} recording(s) changed during the check, not judged: check again"
                   if self.changed else "")
        return (f"{self.store}: {len(self.recordings)} recording(s), {self.objects_checked} file(s) and "
                f"{self.chunks_checked} chunk(s) checked ({depth}, {self.bytes_read / 1e6:.1f} MB read in "
                f"{self.seconds:.1f} s): {found}{changed}")

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (``ok`` included)."""
        data = asdict(self)
        data["ok"] = self.ok
        return data


class _Check:
    """One check of one store (see :func:`check_store`)."""

    def __init__(self, store: Store, report: CheckReport, *, read_data: bool, workers: int, retry: RetryPolicy,
                 progress: Progress):
        self.store, self.report, self.read_data = store, report, read_data
        self.workers, self.retry, self.progress = max(1, workers), retry, progress
        self._lock = threading.Lock()
        self._damage: dict[str, tuple[str, dict[str, None]]] = {}  # object -> (problem, recordings)
        self._sizes: dict[str, int] = {}
        self._read_digests: dict[str, bytes] = {}  # database -> SHA-256 of the bytes the check read

    def _retry(self, action):
        return with_retries(action, self.retry)

    # -- bookkeeping --------------------------------------------------------------------------------

    def damaged(self, name: str, problem: str, recordings: Iterable[str]) -> None:
        with self._lock:
            _, users = self._damage.setdefault(name, (problem, {}))
            users.update(dict.fromkeys(recordings))

    def _count(self, *, objects: int = 0, chunks: int = 0, nbytes: int = 0) -> None:
        with self._lock:
            self.report.objects_checked += objects
            self.report.chunks_checked += chunks
            self.report.bytes_read += nbytes

    def _info(self, name: str) -> ObjectInfo | None:
        """Size of ``name`` from the listing; a stat when the listing missed it (written since, or missing)."""
        size = self._sizes.get(name)
        if size is not None:
            return ObjectInfo(name, size, 0.0)
        return self._retry(lambda: object_info(self.store, name))

    # -- the phases ---------------------------------------------------------------------------------

    def run(self, names: list[str]) -> None:
        self._sizes = {i.name: i.size for i in self._retry(lambda: list(list_info(self.store)))}
        databases: dict[str, RecordingDatabase] = {}

        def read_database(name: str) -> None:
            db = self._database(name)
            if db is not None:
                with self._lock:
                    databases[name] = db

        bounded_parallel(read_database, names, self.workers)
        # Each manifest and code file (name, SHA-256, size) once, with what the recordings naming it expect.
        manifests: dict[ObjectRef, list[tuple[str, str, str]]] = {}
        code: dict[ObjectRef, list[tuple[str, str | None]]] = {}
        for name in names:
            db = databases.get(name)
            if db is None:
                continue
            primary = "ptx" if db.code.ptx else "cubin"
            for kind, ref in db.code.refs().items():
                code.setdefault(ref, []).append((name, db.kernel.name if kind == primary else None))
            for dyn, inst in db.instances.items():
                for phase, ref in (("prologue", inst.prologue), ("epilogue", inst.epilogue)):
                    manifests.setdefault(ref, []).append((name, dyn, phase))
        chunks: dict[str, tuple[ChunkRef, dict[str, None]]] = {}  # name -> (ref, recordings using it)
        self.progress.add_total(len(manifests) + len(code))

        def check_manifest(ref: ObjectRef) -> None:
            users = manifests[ref]
            snapshot = self._manifest(ref, [u[0] for u in users])
            if snapshot is not None:
                for name, dyn, phase in users:
                    static = databases[name].static_hash
                    if (snapshot.static_hash, snapshot.dynamic_hash, snapshot.phase) != (static, dyn, phase):
                        self.damaged(ref.path, f"holds the {snapshot.phase} of {snapshot.static_hash}/"
                                     f"{snapshot.dynamic_hash}, the database expects the {phase} of {static}/{dyn}",
                                     [name])
                with self._lock:
                    for chunk in snapshot.chunk_refs():
                        chunks.setdefault(chunk.name, (chunk, {}))[1].update(dict.fromkeys(u[0] for u in users))
            self.progress.advance(ref.size)

        bounded_parallel(check_manifest, list(manifests), self.workers)
        bounded_parallel(lambda ref: self._code(ref, code[ref]), list(code), self.workers)
        self.progress.add_total(len(chunks))
        bounded_parallel(lambda name: self._chunk(chunks[name][0], list(chunks[name][1])), sorted(chunks),
                         self.workers)

    def _database(self, name: str) -> RecordingDatabase | None:
        self._count(objects=1)
        try:
            raw = self._retry(lambda: self.store.get(name))
        except ArtifactError as exc:
            if self._retry(lambda: self.store.exists(name)):
                self.damaged(name, str(exc), [name])
            else:
                self.report.changed.append(name)  # deleted since the listing (a concurrent clean)
            return None
        self._read_digests[name] = hashlib.sha256(raw).digest()
        self._count(nbytes=len(raw))
        try:
            db = parse_database_bytes(raw, name)
        except ArtifactError as exc:
            self.damaged(name, str(exc).removeprefix(f"{name}: "), [name])
            return None
        if db.name != name:
            self.damaged(name, f"holds kernel {db.static_hash}: it was renamed or replaced", [name])
            return None
        return db

    def _present(self, ref: ObjectRef, users: list[str]) -> bool:
        """Whether the file exists with the size the database records (else it is reported)."""
        info = self._info(ref.path)
        if info is None:
            self.damaged(ref.path, "missing", users)
            return False
        if info.size != ref.size:
            self.damaged(ref.path, f"{info.size} bytes, the database says {ref.size}", users)
            return False
        return True

    def _read(self, name: str, users: list[str]) -> bytes | None:
        try:
            data = self._retry(lambda: self.store.get(name))
        except ArtifactError as exc:
            self.damaged(name, str(exc), users)
            return None
        self._count(nbytes=len(data))
        return data

    def _manifest(self, ref: ObjectRef, users: list[str]) -> Snapshot | None:
        """Read a snapshot manifest (always: its chunks are what the rest of the check needs)."""
        self._count(objects=1)
        if not self._present(ref, users):
            return None
        data = self._read(ref.path, users)
        if data is None:
            return None
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
            self.damaged(ref.path, "content does not match the SHA-256 in the database", users)
            return None
        try:
            return decode_snapshot(data, "the snapshot")
        except ArtifactError as exc:
            self.damaged(ref.path, str(exc), users)
            return None

    def _code(self, ref: ObjectRef, users: list[tuple[str, str | None]]) -> None:
        """A code file: present with its size; with read-data, its SHA-256 and the kernel's static hash."""
        self._count(objects=1)
        names = [u[0] for u in users]
        if self._present(ref, names) and self.read_data:
            data = self._read(ref.path, names)
            if data is not None:
                if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
                    self.damaged(ref.path, "content does not match the SHA-256 in the database", names)
                else:
                    for name, kernel in users:
                        if kernel is not None and static_hash(kernel, data) != name.removesuffix(".json"):
                            self.damaged(ref.path, f"the code of {kernel} hashes to {static_hash(kernel, data)}, "
                                         "not to the recording's static hash", [name])
        self.progress.advance(ref.size)

    def _chunk(self, ref: ChunkRef, users: list[str]) -> None:
        """A chunk: present (and not empty); with read-data, decompressed and hashed against its name."""
        self._count(chunks=1)
        info = self._info(ref.name)
        if info is None:
            self.damaged(ref.name, "missing", users)
        elif info.size == 0:
            self.damaged(ref.name, "empty (0 bytes)", users)
        elif self.read_data:
            blob = self._read(ref.name, users)
            problem = None if blob is None else chunk_problem(blob, ref.digest, ref.length, ref.algorithm)
            if problem is not None:
                self.damaged(ref.name, problem, users)
        self.progress.advance(info.size if info is not None and self.read_data else 0)

    def finish(self) -> None:
        """Leave out recordings whose database changed while the check ran; order the damage by object."""
        suspects = sorted({r for _, users in self._damage.values() for r in users})
        for name in suspects:
            if name not in self._read_digests:
                continue
            try:
                now = hashlib.sha256(self._retry(lambda: self.store.get(name))).digest()
            except ArtifactError:
                now = None
            if now != self._read_digests[name]:
                self.report.changed.append(name)
        changed = set(self.report.changed)
        for name, (problem, users) in sorted(self._damage.items()):
            recordings = sorted(r for r in users if r not in changed)
            if recordings:
                self.report.damage.append(Damage(name, problem, recordings))


def check_store(
    store_or_url: Location,
    recordings: Sequence[str] | None = None,
    *,
    read_data: bool = False,
    workers: int = DEFAULT_WORKERS,
    retry: RetryPolicy = RetryPolicy(),
    progress: bool | None = None,
) -> CheckReport:
    """Check that every object the recordings of a store name is present and intact (see the module doc).

    Args:
        store_or_url: the store (a Store, a directory path or an ``s3://bucket/prefix`` URL); it must exist.
        recordings: static hashes (or ``<static>.json`` names) to check; None checks every recording.
        read_data: also read and hash every chunk and code file (else: structure, sizes and manifests).
        workers: parallel reads (at most ``2 * workers`` objects in memory).
        retry: backoff while the store is unreachable.
        progress: a progress bar on stderr (None: when stderr is a terminal).

    Returns:
        The report; ``report.ok`` is False when damage was found (each entry names the object, the
        problem and the recordings that use it).

    Raises:
        ArtifactError: the store does not exist, or a named recording is not in it.
        StoreUnavailableError: the store stayed unreachable through the retries.
    """
    store = existing_store(store_or_url)
    report = CheckReport(store.url, read_data)
    started = time.monotonic()
    names = with_retries(lambda: select_databases(store, recordings), retry)
    report.recordings = list(names)
    with Progress(progress, f"checking {store.url}") as bar:
        job = _Check(store, report, read_data=read_data, workers=workers, retry=retry, progress=bar)
        job.run(names)
        job.finish()
    report.seconds = time.monotonic() - started
    return report
