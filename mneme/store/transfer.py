"""Moving recordings between stores: push, pull, copy, move.

Every operation works on any pair of backends (a directory or ``s3://``) and
keeps the commit order of the format: for each recording, its chunks first
(skipping chunks the destination already has: chunks are content-addressed
and shared by every recording in a store, across jobs), then its snapshot and
code files, then its database, last. A reader of the destination therefore
never sees a database that names something missing, even while a transfer
runs or after one was killed. Everything copied is verified against the hash
that names it (chunks) or that the database records (other files) before it
is written.

Transient failures (:class:`mneme.store.s3.StoreUnavailableError`: network
down, server restarting) are retried with exponential backoff; memory stays
bounded by ``workers`` chunks in flight. See docs/store.md.

The other verbs live next to this module: clean and gc in
:mod:`mneme.store.cleanup`, ls in :mod:`mneme.store.summary`, the record
agent's uploader in :mod:`mneme.store.uploader`, retries in
:mod:`mneme.store.retry`, what a store holds in :mod:`mneme.store.contents`.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence, TypeVar

from mneme.errors import ArtifactError, ConfigurationError
from mneme.format.chunks import ChunkRef
from mneme.format.database import load_database, merge_databases, save_database
from mneme.format.objects import ObjectRef
from mneme.store import Store
from mneme.store.cleanup import DEFAULT_GC_GRACE_S, CleanReport, clean
from mneme.store.contents import (
    Location,
    RecordingContents,
    as_store,
    existing_store,
    object_info,
    read_recording,
    select_databases,
    touch,
    verified_chunk,
)
from mneme.store.parallel import Progress, bounded_parallel
from mneme.store.retry import RetryPolicy, with_retries

T = TypeVar("T")
DEFAULT_WORKERS = 8
#: A transfer that reuses a chunk older than this refreshes its time, so that a concurrent gc keeps it.
TOUCH_AFTER_S = 600.0


@dataclass
class TransferReport:
    """What a transfer did (counts and bytes written to the destination).

    ``repaired`` names the objects the destination held damaged (wrong size or
    content) that were replaced with the source's verified copy.
    """

    source: str
    destination: str
    recordings: list[str] = field(default_factory=list)
    committed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    chunks_copied: int = 0
    chunks_present: int = 0
    objects_copied: int = 0
    objects_present: int = 0
    bytes_copied: int = 0
    seconds: float = 0.0
    repair: bool = False
    repaired: list[str] = field(default_factory=list)

    def summary(self) -> str:
        rate = self.bytes_copied / self.seconds / 1e6 if self.seconds > 0 else 0.0
        repaired = ""
        if self.repair or self.repaired:
            repaired = f"; repaired {len(self.repaired)} damaged object(s) at the destination"
        return (
            f"{len(self.recordings)} recording(s) from {self.source} to {self.destination}: "
            f"{len(self.committed)} committed, {len(self.unchanged)} already there; "
            f"chunks {self.chunks_copied} copied, {self.chunks_present} already there; "
            f"files {self.objects_copied} copied, {self.objects_present} already there{repaired}; "
            f"{self.bytes_copied / 1e6:.1f} MB in {self.seconds:.1f} s ({rate:.1f} MB/s)"
        )

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (``mneme push/pull/copy/move --json``): every field of the summary line."""
        return asdict(self)


class _Transfer:
    """One transfer between two stores (see :func:`transfer`)."""

    def __init__(self, source: Store, destination: Store, *, resume: bool, repair: bool, workers: int,
                 retry: RetryPolicy, progress: Progress, report: TransferReport, sent: dict[str, bytes] | None):
        if source.url == destination.url:
            raise ConfigurationError(f"source and destination are the same store ({source.url})")
        self.src, self.dst = source, destination
        self.resume, self.repair, self.workers, self.retry = resume, repair, max(1, workers), retry
        self.progress, self.report = progress, report
        self.sent = {} if sent is None else sent
        self._done_chunks: set[str] = set()
        self._lock = threading.Lock()

    def _retry(self, action: Callable[[], T]) -> T:
        return with_retries(action, self.retry)

    def recording(self, name: str) -> None:
        """Copy one recording: chunks, then files, then the database."""
        raw = self._retry(lambda: self.src.get(name))
        if not self.repair and (self.sent.get(name) == raw or self._database_unchanged(name, raw)):
            self.sent[name] = raw
            self.report.unchanged.append(name)
            return
        contents = read_recording(self.src, name, self.retry, raw)
        self.progress.add_total(len(contents.chunks) + len(contents.objects) + 1)
        self._parallel(self._chunk, [c for c in contents.chunks])
        self._parallel(self._object, list(contents.objects))
        self._commit(contents)
        self.sent[name] = raw
        self.report.committed.append(name)

    def _database_unchanged(self, name: str, raw: bytes) -> bool:
        """Whether the destination already holds this exact database (and so, everything it names)."""
        if not self._retry(lambda: self.dst.exists(name)):
            return False
        return self._retry(lambda: self.dst.get(name)) == raw

    def _parallel(self, action: Callable[[T], None], items: Sequence[T]) -> None:
        bounded_parallel(action, items, min(self.workers, max(1, len(items))))

    def _chunk(self, ref: ChunkRef) -> None:
        name = ref.name
        with self._lock:
            seen = name in self._done_chunks
            self._done_chunks.add(name)
        if seen:
            self.progress.advance()
            return
        info = self._retry(lambda: object_info(self.dst, name))
        damage = None
        if info is not None:
            damage = self._chunk_damage(ref, info.size)
            if damage is None:
                # Content-addressed: same name, same content. Refresh its age so a concurrent gc keeps it.
                if time.time() - info.modified > TOUCH_AFTER_S:
                    self._retry(lambda: touch(self.dst, name))
                with self._lock:
                    self.report.chunks_present += 1
                self.progress.advance()
                return
        if not self._retry(lambda: self.src.exists(name)):
            held = f"is damaged in {self.dst.url} ({damage})" if damage else f"is missing from {self.dst.url}"
            raise ArtifactError(
                f"chunk {name} is missing from {self.src.url} and {held}; the source recording is incomplete"
            )
        blob = self._retry(lambda: verified_chunk(self.src, ref))
        self._retry(lambda: self.dst.put(name, blob))
        with self._lock:
            self.report.chunks_copied += 1
            self.report.bytes_copied += len(blob)
            if damage is not None:
                self.report.repaired.append(name)
        self.progress.advance(len(blob))

    def _chunk_damage(self, ref: ChunkRef, size: int) -> str | None:
        """Why the destination's copy of a chunk is damaged, or None when it is good (or assumed good).

        With ``repair`` its content is read and checked. Otherwise only its size
        is compared with the source's copy (a stat; free for a directory): a
        chunk of another size may just be compressed differently, so only then
        is its content read and checked. A flipped bit keeps the size: that
        takes ``repair`` (or ``mneme check --read-data``) to find.
        """
        if not self.repair:
            source = self._retry(lambda: object_info(self.src, ref.name))
            if source is None or source.size == size:
                return None
        try:
            self._retry(lambda: verified_chunk(self.dst, ref))
        except ArtifactError as exc:
            if not self._retry(lambda: self.dst.exists(ref.name)):
                return "deleted while being checked"
            return str(exc)
        return None

    def _object(self, ref: ObjectRef) -> None:
        """Copy a snapshot or code file, verified against the database's SHA-256 and size."""
        state = self._destination_state(ref) if self.resume or self.repair else None
        if state == "good":
            with self._lock:
                self.report.objects_present += 1
            self.progress.advance()
            return
        if not self._retry(lambda: self.src.exists(ref.path)):
            if state is None:
                state = self._destination_state(ref)
            if state == "good":
                with self._lock:  # uploaded earlier and pruned from a spool: nothing to do
                    self.report.objects_present += 1
                self.progress.advance()
                return
        data = self._retry(lambda: ref.read(self.src))
        self._retry(lambda: self.dst.put(ref.path, data))
        with self._lock:
            self.report.objects_copied += 1
            self.report.bytes_copied += len(data)
            if state == "damaged":
                self.report.repaired.append(ref.path)
        self.progress.advance(len(data))

    def _destination_state(self, ref: ObjectRef) -> str:
        """``good`` (exactly this object), ``damaged`` (other size or SHA-256) or ``missing`` at the destination."""
        info = self._retry(lambda: object_info(self.dst, ref.path))
        if info is None:
            return "missing"
        if info.size != ref.size:
            return "damaged"
        data = self._retry(lambda: self.dst.get(ref.path))
        return "good" if hashlib.sha256(data).hexdigest() == ref.sha256 else "damaged"

    def _commit(self, contents: RecordingContents) -> None:
        """Write the database last: byte-exact when the destination has none, else merged into its one."""
        name = contents.name
        changed = True
        if not self._retry(lambda: self.dst.exists(name)):
            self._retry(lambda: self.dst.put(name, contents.raw))
        else:
            try:
                existing = self._retry(lambda: load_database(self.dst, name))
            except ArtifactError as exc:
                if not self.repair:
                    raise ArtifactError(
                        f"{exc}; `mneme push --repair` replaces it with the copy from {self.src.url} (instances "
                        "only the damaged copy had are lost)"
                    ) from exc
                self._retry(lambda: self.dst.put(name, contents.raw))
                self.report.repaired.append(name)
                existing = None
            if existing is not None:
                merged = merge_databases(existing, contents.database)
                changed = merged != existing
                if changed:
                    self._retry(lambda: save_database(self.dst, merged))
        stored = self._retry(lambda: load_database(self.dst, name))
        lost = [k for k, v in contents.database.instances.items() if stored.instances.get(k) != v]
        if lost:  # another writer replaced the database between our read and our write: merge again
            self._retry(lambda: save_database(self.dst, merge_databases(stored, contents.database)))
            changed = True
        if changed:
            self.report.bytes_copied += len(contents.raw)
        self.progress.advance(len(contents.raw) if changed else 0)


def transfer(
    source: Location,
    destination: Location,
    *,
    recordings: Sequence[str] | None = None,
    resume: bool = False,
    repair: bool = False,
    workers: int = DEFAULT_WORKERS,
    retry: RetryPolicy = RetryPolicy(),
    progress: bool | None = None,
    sent: dict[str, bytes] | None = None,
) -> TransferReport:
    """Copy recordings (all, or the static hashes in ``recordings``) from ``source`` to ``destination``.

    Chunks the destination has are never sent again (in any mode), unless its
    copy is damaged: a chunk whose size differs from the source's is read and
    checked, and replaced when it does not match its name. Snapshot and code
    files are rewritten unless ``resume`` is set, in which case files already
    at the destination with the right SHA-256 are kept: run with ``resume``
    after a killed transfer. A database the destination already has is merged
    with the source's (instances of both are kept); an identical one means the
    recording is skipped outright, so repeated pushes of a growing directory
    only send what is new.

    Args:
        source: where the recordings are (a Store, a directory or an ``s3://`` URL); it must exist.
        destination: where they go.
        recordings: static hashes (or ``<static>.json`` names) to copy; None copies all.
        resume: keep snapshot and code files the destination holds with the right SHA-256.
        repair: verify everything the destination already holds of these recordings (every chunk
            decompressed and hashed, every file hashed; recordings whose database is unchanged are not
            skipped) and replace what is damaged, including an unreadable database, with the source's
            verified copy; implies ``resume``. The report's ``repaired`` names what was replaced.
        workers: parallel object transfers (at most ``2 * workers`` objects in memory).
        retry: backoff for an unreachable store.
        progress: a progress bar on stderr (None: when stderr is a terminal).
        sent: name -> database bytes last committed, for a caller that pushes repeatedly (the record
            agent's uploader): unchanged recordings are skipped without asking the destination. Updated
            in place.

    Returns:
        What was copied, found present, repaired, and how long it took.
    """
    src, dst = existing_store(source), as_store(destination)
    report = TransferReport(src.url, dst.url, repair=repair)
    started = time.monotonic()
    names = with_retries(lambda: select_databases(src, recordings), retry)
    report.recordings = list(names)
    with Progress(progress, f"{src.url} -> {dst.url}") as bar:
        job = _Transfer(src, dst, resume=resume, repair=repair, workers=workers, retry=retry, progress=bar,
                        report=report, sent=sent)
        for name in names:
            job.recording(name)
    report.seconds = time.monotonic() - started
    return report


def push(source: Location, destination: Location, **options) -> TransferReport:
    """Upload recordings (usually a directory to ``s3://``); see :func:`transfer` for the options."""
    return transfer(source, destination, **options)


def pull(source: Location, destination: Location, **options) -> TransferReport:
    """Download recordings; into an empty directory this reproduces the source layout byte-exact."""
    return transfer(source, destination, **options)


copy = transfer


def move(
    source: Location,
    destination: Location,
    *,
    recordings: Sequence[str] | None = None,
    grace_s: float = DEFAULT_GC_GRACE_S,
    **options,
) -> tuple[TransferReport, "CleanReport"]:
    """Copy recordings, then delete them from the source (only after the copy committed)."""
    src = existing_store(source)
    retry = options.get("retry", RetryPolicy())
    names = with_retries(lambda: select_databases(src, recordings), retry)
    report = transfer(src, destination, recordings=names, **options)
    return report, clean(src, names, grace_s=grace_s, retry=retry)
