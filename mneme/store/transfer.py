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
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence, TypeVar

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
    object_info,
    read_recording,
    select_databases,
    touch,
    verified_chunk,
)
from mneme.store.retry import RetryPolicy, with_retries

T = TypeVar("T")
DEFAULT_WORKERS = 8
#: A transfer that reuses a chunk older than this refreshes its time, so that a concurrent gc keeps it.
TOUCH_AFTER_S = 600.0


@dataclass
class TransferReport:
    """What a transfer did (counts and bytes written to the destination)."""

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

    def summary(self) -> str:
        rate = self.bytes_copied / self.seconds / 1e6 if self.seconds > 0 else 0.0
        return (
            f"{len(self.recordings)} recording(s) from {self.source} to {self.destination}: "
            f"{len(self.committed)} committed, {len(self.unchanged)} already there; "
            f"chunks {self.chunks_copied} copied, {self.chunks_present} already there; "
            f"files {self.objects_copied} copied, {self.objects_present} already there; "
            f"{self.bytes_copied / 1e6:.1f} MB in {self.seconds:.1f} s ({rate:.1f} MB/s)"
        )


class _Progress:
    """A rich progress bar on a terminal; nothing otherwise."""

    def __init__(self, enabled: bool | None, label: str):
        if enabled is None:
            enabled = sys.stderr.isatty()
        self._bar = None
        self._lock = threading.Lock()
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[mb]:.1f} MB"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self._task = self._bar.add_task(label, total=0, mb=0.0)

    def __enter__(self) -> "_Progress":
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def add_total(self, n: int) -> None:
        if self._bar is not None:
            with self._lock:
                total = self._bar.tasks[0].total or 0
                self._bar.update(self._task, total=total + n)

    def advance(self, nbytes: int = 0) -> None:
        if self._bar is not None:
            with self._lock:
                mb = self._bar.tasks[0].fields["mb"] + nbytes / 1e6
                self._bar.update(self._task, advance=1, mb=mb)


class _Transfer:
    """One transfer between two stores (see :func:`transfer`)."""

    def __init__(self, source: Store, destination: Store, *, resume: bool, workers: int, retry: RetryPolicy,
                 progress: _Progress, report: TransferReport, sent: dict[str, bytes] | None):
        if source.url == destination.url:
            raise ConfigurationError(f"source and destination are the same store ({source.url})")
        self.src, self.dst = source, destination
        self.resume, self.workers, self.retry = resume, max(1, workers), retry
        self.progress, self.report = progress, report
        self.sent = {} if sent is None else sent
        self._done_chunks: set[str] = set()
        self._lock = threading.Lock()

    def _retry(self, action: Callable[[], T]) -> T:
        return with_retries(action, self.retry)

    def recording(self, name: str) -> None:
        """Copy one recording: chunks, then files, then the database."""
        raw = self._retry(lambda: self.src.get(name))
        if self.sent.get(name) == raw or self._database_unchanged(name, raw):
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
        """Run ``action`` over ``items`` on the pool, at most ``2 * workers`` in flight (bounded memory)."""
        if not items:
            return
        with ThreadPoolExecutor(max_workers=min(self.workers, len(items))) as pool:
            pending: set[Future] = set()
            for item in items:
                if len(pending) >= 2 * self.workers:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        future.result()
                pending.add(pool.submit(action, item))
            for future in pending:
                future.result()

    def _chunk(self, ref: ChunkRef) -> None:
        name = ref.name
        with self._lock:
            seen = name in self._done_chunks
            self._done_chunks.add(name)
        if seen:
            self.progress.advance()
            return
        info = self._retry(lambda: object_info(self.dst, name))
        if info is not None:
            # Content-addressed: same name, same content. Refresh its age so a concurrent gc keeps it.
            if time.time() - info.modified > TOUCH_AFTER_S:
                self._retry(lambda: touch(self.dst, name))
            with self._lock:
                self.report.chunks_present += 1
            self.progress.advance()
            return
        if not self._retry(lambda: self.src.exists(name)):
            raise ArtifactError(
                f"chunk {name} is missing from {self.src.url} and from {self.dst.url}; the source recording is "
                "incomplete"
            )
        blob = self._retry(lambda: verified_chunk(self.src, ref))
        self._retry(lambda: self.dst.put(name, blob))
        with self._lock:
            self.report.chunks_copied += 1
            self.report.bytes_copied += len(blob)
        self.progress.advance(len(blob))

    def _object(self, ref: ObjectRef) -> None:
        """Copy a snapshot or code file, verified against the database's SHA-256 and size."""
        if self.resume and self._present(ref):
            with self._lock:
                self.report.objects_present += 1
            self.progress.advance()
            return
        if not self._retry(lambda: self.src.exists(ref.path)) and self._present(ref):
            with self._lock:  # uploaded earlier and pruned from a spool: nothing to do
                self.report.objects_present += 1
            self.progress.advance()
            return
        data = self._retry(lambda: ref.read(self.src))
        self._retry(lambda: self.dst.put(ref.path, data))
        with self._lock:
            self.report.objects_copied += 1
            self.report.bytes_copied += len(data)
        self.progress.advance(len(data))

    def _present(self, ref: ObjectRef) -> bool:
        """Whether the destination holds exactly this object (size first, then the SHA-256)."""
        info = self._retry(lambda: object_info(self.dst, ref.path))
        if info is None or info.size != ref.size:
            return False
        data = self._retry(lambda: self.dst.get(ref.path))
        return hashlib.sha256(data).hexdigest() == ref.sha256

    def _commit(self, contents: RecordingContents) -> None:
        """Write the database last: byte-exact when the destination has none, else merged into its one."""
        name = contents.name
        if not self._retry(lambda: self.dst.exists(name)):
            self._retry(lambda: self.dst.put(name, contents.raw))
        else:
            existing = self._retry(lambda: load_database(self.dst, name))
            merged = merge_databases(existing, contents.database)
            if merged != existing:
                self._retry(lambda: save_database(self.dst, merged))
        stored = self._retry(lambda: load_database(self.dst, name))
        lost = [k for k, v in contents.database.instances.items() if stored.instances.get(k) != v]
        if lost:  # another writer replaced the database between our read and our write: merge again
            self._retry(lambda: save_database(self.dst, merge_databases(stored, contents.database)))
        self.report.bytes_copied += len(contents.raw)
        self.progress.advance(len(contents.raw))


def transfer(
    source: Location,
    destination: Location,
    *,
    recordings: Sequence[str] | None = None,
    resume: bool = False,
    workers: int = DEFAULT_WORKERS,
    retry: RetryPolicy = RetryPolicy(),
    progress: bool | None = None,
    sent: dict[str, bytes] | None = None,
) -> TransferReport:
    """Copy recordings (all, or the static hashes in ``recordings``) from ``source`` to ``destination``.

    Chunks the destination has are never sent again (in any mode). Snapshot
    and code files are rewritten unless ``resume`` is set, in which case files
    already at the destination with the right SHA-256 are kept: run with
    ``resume`` after a killed transfer. A database the destination already has
    is merged with the source's (instances of both are kept); an identical
    one means the recording is skipped outright, so repeated pushes of a
    growing directory only send what is new. ``sent`` (name -> database bytes
    last committed) lets a caller that pushes repeatedly skip unchanged
    recordings without asking the destination; it is updated in place.
    """
    src, dst = as_store(source), as_store(destination)
    root = getattr(src, "root", None)
    if isinstance(root, Path) and not root.is_dir():
        raise ArtifactError(f"{src.url} does not exist or is not a directory; check the source path")
    report = TransferReport(src.url, dst.url)
    started = time.monotonic()
    names = with_retries(lambda: select_databases(src, recordings), retry)
    report.recordings = list(names)
    with _Progress(progress, f"{src.url} -> {dst.url}") as bar:
        job = _Transfer(src, dst, resume=resume, workers=workers, retry=retry, progress=bar, report=report,
                        sent=sent)
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
    src = as_store(source)
    retry = options.get("retry", RetryPolicy())
    names = with_retries(lambda: select_databases(src, recordings), retry)
    report = transfer(src, destination, recordings=names, **options)
    return report, clean(src, names, grace_s=grace_s, retry=retry)
