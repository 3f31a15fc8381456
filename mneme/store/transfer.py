"""Moving recordings between stores: push, pull, copy, move, clean, gc, ls, and the record agent's uploader.

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
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence, TypeVar, Union

import zstandard

from mneme.errors import ArtifactError, ConfigurationError, MnemeError
from mneme.format.chunks import MAX_CHUNK_SIZE, ChunkRef
from mneme.format.database import (
    RecordingDatabase,
    load_database,
    merge_databases,
    parse_database_bytes,
    save_database,
)
from mneme.format.layout import CHUNKS_DIR
from mneme.format.objects import ObjectRef
from mneme.format.snapshot import read_snapshot
from mneme.store import Store, open_store
from mneme.store.s3 import ObjectInfo, StoreUnavailableError

T = TypeVar("T")
#: What transfers accept for a store: a Store, a directory path or an s3:// URL.
Location = Union[Store, str, "os.PathLike[str]"]

DATABASE_NAME = re.compile(r"[0-9]{1,20}\.json")
#: Objects a recording consists of besides its database (what gc may remove when nothing names them).
RECORDING_OBJECT = re.compile(
    r"chunks/[0-9a-f]{2}/[0-9a-f]{64}"
    r"|DeviceState\.(prologue|epilogue)\.[0-9]{1,20}\.[0-9]{1,20}\.mneme"
    r"|Kernel_[0-9]{1,20}\.(ptx|cubin)"
    r"|RecordedIR_[0-9]{1,20}\.bc"
)
DEFAULT_WORKERS = 8
#: gc keeps unreferenced objects younger than this (seconds): they may belong to an upload in progress.
DEFAULT_GC_GRACE_S = 3600.0
#: A transfer that reuses a chunk older than this refreshes its time, so that a concurrent gc keeps it.
TOUCH_AFTER_S = 600.0


# -- retries -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter for transient store errors.

    The defaults ride out about a minute of network trouble per operation
    (0.5, 1, 2, 4, 8, 16, 30 s); the record agent's :class:`Uploader` retries
    whole passes on top of that, for as long as it runs.
    """

    attempts: int = 8
    initial_delay_s: float = 0.5
    max_delay_s: float = 30.0

    def delays(self) -> Iterator[float]:
        delay = self.initial_delay_s
        for _ in range(self.attempts - 1):
            yield min(delay, self.max_delay_s) * random.uniform(0.8, 1.2)
            delay *= 2


def with_retries(action: Callable[[], T], policy: RetryPolicy, sleep: Callable[[float], None] = time.sleep) -> T:
    """Run ``action``; on :class:`StoreUnavailableError` wait and try again, per ``policy``."""
    delays = policy.delays()
    while True:
        try:
            return action()
        except StoreUnavailableError:
            delay = next(delays, None)
            if delay is None:
                raise
            sleep(delay)


# -- reading what a store holds -------------------------------------------------------------------


def as_store(store_or_url: Location) -> Store:
    return store_or_url if isinstance(store_or_url, Store) else open_store(store_or_url)


def database_names(store: Store) -> list[str]:
    """The recording databases (``<static>.json``) at the top of ``store``.

    Listing by leading digit keeps the listing out of the (large) ``chunks/`` tree.
    """
    return [n for digit in "0123456789" for n in store.list(digit) if DATABASE_NAME.fullmatch(n)]


def select_databases(store: Store, recordings: Sequence[str] | None) -> list[str]:
    """Database names for ``recordings`` (static hashes or ``<static>.json``); all of them when None."""
    available = database_names(store)
    if not recordings:
        return available
    chosen = []
    for item in recordings:
        name = item if item.endswith(".json") else f"{item}.json"
        if name not in available:
            raise ArtifactError(
                f"no recording {item} in {store.url}; `mneme ls {store.url}` lists the recordings there"
            )
        chosen.append(name)
    return chosen


@dataclass(frozen=True)
class RecordingContents:
    """One recording as stored: its database (parsed and raw) and every object and chunk it needs."""

    name: str
    raw: bytes
    database: RecordingDatabase
    objects: tuple[ObjectRef, ...]
    chunks: tuple[ChunkRef, ...]
    logical_bytes: int
    instance_bytes: dict[str, int] = field(default_factory=dict)  # dynamic hash -> its snapshots' memory

    @property
    def chunk_names(self) -> set[str]:
        return {c.name for c in self.chunks}


def read_recording(
    store: Store, name: str, retry: RetryPolicy = RetryPolicy(), raw: bytes | None = None
) -> RecordingContents:
    """Load database ``name`` (unless its bytes are given) and the snapshot manifests it names.

    Each manifest is checked against the SHA-256 and size the database records.
    """
    if raw is None:
        raw = with_retries(lambda: store.get(name), retry)
    database = parse_database_bytes(raw, f"{name} in {store.url}")
    if database.name != name:
        raise ArtifactError(f"{name} in {store.url} holds kernel {database.static_hash}; it was renamed")
    objects = tuple(dict.fromkeys(database.referenced_objects()))
    chunks: dict[ChunkRef, None] = {}
    per_instance: dict[str, int] = {}
    for instance in database.instances.values():
        for ref in (instance.prologue, instance.epilogue):
            snapshot = with_retries(lambda: read_snapshot(store, ref.path, sha256=ref.sha256, size=ref.size), retry)
            per_instance[instance.dynamic_hash] = per_instance.get(instance.dynamic_hash, 0) + snapshot.total_size
            for region in snapshot.regions:
                chunks.update(dict.fromkeys(region.chunks))
    return RecordingContents(name, raw, database, objects, tuple(chunks), sum(per_instance.values()), per_instance)


def check_chunk_blob(blob: bytes, sha256: str, what: str, length: int | None = None) -> None:
    """Raise ArtifactError unless ``blob`` (a stored chunk) decompresses to content with hash ``sha256``.

    ``length`` (from the snapshot, when known) is checked against the size the
    zstd frame declares before anything is allocated.
    """
    declared = zstandard.frame_content_size(blob) if len(blob) >= 4 else -2
    limit = MAX_CHUNK_SIZE if length is None else length
    if declared == -2 or declared > limit or (length is not None and declared not in (-1, length)):
        raise ArtifactError(f"{what} is corrupt: its header declares {declared} bytes"
                            + ("" if length is None else f", the snapshot says {length}"))
    try:
        piece = zstandard.ZstdDecompressor().decompress(blob, max_output_size=max(limit, 1))
    except zstandard.ZstdError as exc:
        raise ArtifactError(f"{what} is corrupt (zstd: {exc})") from None
    if (length is not None and len(piece) != length) or hashlib.sha256(piece).hexdigest() != sha256:
        raise ArtifactError(f"{what} is corrupt: its content does not match its name")


def verified_chunk(store: Store, ref: ChunkRef) -> bytes:
    """The stored (compressed) bytes of chunk ``ref``, after checking they decompress to its content."""
    blob = store.get(ref.name)
    check_chunk_blob(blob, ref.sha256, f"chunk {ref.name} in {store.url}", ref.length)
    return blob


# -- object ages (for gc and for refreshing reused chunks) ------------------------------------------


def object_info(store: Store, name: str) -> ObjectInfo | None:
    """Size and modification time of ``name`` where the backend knows them (None: missing)."""
    stat = getattr(store, "stat", None)
    if stat is not None:
        return stat(name)
    path = store.local_path(name)
    if path is not None:
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        return ObjectInfo(name, st.st_size, st.st_mtime)
    if not store.exists(name):
        return None
    return ObjectInfo(name, store.size(name), time.time())  # unknown age: count as new (gc keeps it)


def list_info(store: Store, prefix: str = "") -> Iterator[ObjectInfo]:
    """``store.list(prefix)`` with sizes and times (one listing on S3, ``stat`` on files)."""
    listing = getattr(store, "list_info", None)
    if listing is not None:
        yield from listing(prefix)
        return
    for name in store.list(prefix):
        info = object_info(store, name)
        if info is not None:
            yield info


def touch(store: Store, name: str) -> None:
    """Refresh the modification time of ``name`` (so that gc counts it as new)."""
    refresh = getattr(store, "touch", None)
    if refresh is not None:
        refresh(name)
        return
    path = store.local_path(name)
    if path is not None:
        try:
            os.utime(path)
        except FileNotFoundError:
            pass


# -- the transfer ----------------------------------------------------------------------------------


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


# -- deleting: clean and gc ------------------------------------------------------------------------


@dataclass
class CleanReport:
    """What clean or gc removed (or, in a dry run, would remove)."""

    store: str
    databases: list[str] = field(default_factory=list)
    objects: int = 0
    chunks: int = 0
    bytes: int = 0
    kept_young: int = 0
    dry_run: bool = False

    def summary(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        young = ""
        if self.kept_young:
            young = f"; kept {self.kept_young} unreferenced object(s) younger than the grace period"
        recs = f"{len(self.databases)} recording(s), " if self.databases else ""
        return (f"{self.store}: {verb} {recs}{self.objects} file(s) and {self.chunks} chunk(s), "
                f"{self.bytes / 1e6:.1f} MB{young}")


def referenced_names(store: Store, databases: Iterable[str], retry: RetryPolicy = RetryPolicy()) -> set[str]:
    """Every object name the given databases need (their files and chunks, and themselves).

    A database that cannot be read stops the caller: deleting without knowing
    what it references could destroy a recording.
    """
    names: set[str] = set()
    for name in databases:
        try:
            contents = read_recording(store, name, retry)
        except ArtifactError as exc:
            raise ArtifactError(
                f"cannot tell what {name} references ({exc}); nothing was deleted. Repair or remove that "
                "recording first (`mneme clean` it), then retry"
            ) from exc
        names.add(name)
        names.update(ref.path for ref in contents.objects)
        names.update(contents.chunk_names)
    return names


def gc(
    store_or_url: Location,
    *,
    grace_s: float = DEFAULT_GC_GRACE_S,
    dry_run: bool = False,
    retry: RetryPolicy = RetryPolicy(),
) -> CleanReport:
    """Remove chunks and recording files that no database references and that are older than ``grace_s``.

    Safe against concurrent uploads: an upload writes a recording's chunks and
    files before its database, so they are unreferenced for a while; they are
    also new (or, when reused, refreshed by the upload), and gc keeps anything
    younger than the grace period. Keep the grace period longer than the
    longest upload of one recording.
    """
    store = as_store(store_or_url)
    report = CleanReport(store.url, dry_run=dry_run)
    keep = referenced_names(store, with_retries(lambda: database_names(store), retry), retry)
    now = time.time()
    candidates = [info for info in with_retries(lambda: list(list_info(store)), retry)
                  if info.name not in keep and RECORDING_OBJECT.fullmatch(info.name)]
    for info in candidates:
        if now - info.modified < grace_s:
            report.kept_young += 1
            continue
        # Re-check right before deleting: an upload may have reused (and refreshed) it since the listing.
        fresh = with_retries(lambda: object_info(store, info.name), retry)
        if fresh is None or time.time() - fresh.modified < grace_s:
            report.kept_young += fresh is not None
            continue
        if not dry_run:
            with_retries(lambda: store.delete(info.name), retry)
        if info.name.startswith(CHUNKS_DIR + "/"):
            report.chunks += 1
        else:
            report.objects += 1
        report.bytes += info.size
    return report


def clean(
    store_or_url: Location,
    recordings: Sequence[str] | None = None,
    *,
    grace_s: float = DEFAULT_GC_GRACE_S,
    collect_chunks: bool = True,
    dry_run: bool = False,
    retry: RetryPolicy = RetryPolicy(),
) -> CleanReport:
    """Delete recordings (all when ``recordings`` is None): databases first, then their files, then chunks.

    Deleting the database first makes the recording disappear at once for
    readers. Snapshot and code files that no remaining recording names go
    next; chunks are shared, so they are left to :func:`gc` (run here unless
    ``collect_chunks`` is false, with the same grace period).
    """
    store = as_store(store_or_url)
    report = CleanReport(store.url, dry_run=dry_run)
    doomed = with_retries(lambda: select_databases(store, recordings), retry)
    remaining = [n for n in with_retries(lambda: database_names(store), retry) if n not in doomed]
    keep = referenced_names(store, remaining, retry)
    files: set[str] = set()
    for name in doomed:
        try:
            database = load_database(store, name)
            files.update(ref.path for ref in database.referenced_objects())
        except ArtifactError:
            pass  # a corrupt database is deleted too; its files become unreferenced and gc takes them
        if not dry_run:
            with_retries(lambda: store.delete(name), retry)
        report.databases.append(name)
    for path in sorted(files - keep):
        info = with_retries(lambda: object_info(store, path), retry)
        if info is None:
            continue
        if not dry_run:
            with_retries(lambda: store.delete(path), retry)
        report.objects += 1
        report.bytes += info.size
    if collect_chunks and not dry_run:
        collected = gc(store, grace_s=grace_s, retry=retry)
        report.chunks, report.bytes = collected.chunks, report.bytes + collected.bytes
        report.objects += collected.objects
        report.kept_young = collected.kept_young
    return report


# -- ls ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InstanceSummary:
    dynamic_hash: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    captured_bytes: int = 0  # device memory its prologue and epilogue hold
    unsupported: tuple[str, ...] = ()  # why the recorder could not capture it (replay refuses it)


@dataclass(frozen=True)
class RecordingSummary:
    """One recording as ``mneme ls`` shows it."""

    database: str
    kernel: str
    instances: tuple[InstanceSummary, ...]
    logical_bytes: int
    unique_chunk_bytes: int
    chunk_count: int

    @property
    def dedupe_ratio(self) -> float:
        return self.logical_bytes / self.unique_chunk_bytes if self.unique_chunk_bytes else 0.0

    @property
    def largest_instance_bytes(self) -> int:
        return max((i.captured_bytes for i in self.instances), default=0)

    @property
    def unsupported_count(self) -> int:
        return sum(1 for i in self.instances if i.unsupported)


@dataclass(frozen=True)
class StoreSummary:
    """All recordings of a store and how well the shared chunks deduplicate them.

    ``dedupe_ratio`` = logical bytes (every snapshot's memory, prologues and
    epilogues of every instance) / bytes of the stored chunks they reference
    (compressed, each counted once).
    """

    url: str
    recordings: tuple[RecordingSummary, ...]
    logical_bytes: int
    stored_chunk_bytes: int
    chunk_count: int

    @property
    def dedupe_ratio(self) -> float:
        return self.logical_bytes / self.stored_chunk_bytes if self.stored_chunk_bytes else 0.0


def summarize(store_or_url: Location, retry: RetryPolicy = RetryPolicy()) -> StoreSummary:
    """Read every database and snapshot manifest of a store and size what they use."""
    store = as_store(store_or_url)
    sizes = {info.name: info.size for info in with_retries(lambda: list(list_info(store, CHUNKS_DIR + "/")), retry)}
    summaries = []
    all_chunks: set[str] = set()
    for name in with_retries(lambda: database_names(store), retry):
        contents = read_recording(store, name, retry)
        chunk_names = contents.chunk_names
        all_chunks |= chunk_names
        db = contents.database
        instances = tuple(
            InstanceSummary(i.dynamic_hash, (i.grid.x, i.grid.y, i.grid.z), (i.block.x, i.block.y, i.block.z),
                            i.shared_mem, contents.instance_bytes.get(i.dynamic_hash, 0), i.unsupported)
            for i in sorted(db.instances.values(), key=lambda i: (i.launch_index, i.dynamic_hash))
        )
        summaries.append(RecordingSummary(
            name, db.kernel.demangled or db.kernel.name, instances, contents.logical_bytes,
            sum(sizes.get(c, 0) for c in chunk_names), len(chunk_names),
        ))
    return StoreSummary(store.url, tuple(summaries), sum(s.logical_bytes for s in summaries),
                        sum(sizes.get(c, 0) for c in all_chunks), len(all_chunks))


# -- the record agent's uploader ---------------------------------------------------------------------


def spool_bytes(directory: str | os.PathLike[str]) -> int:
    """Bytes of the chunks in a staging directory waiting for upload (what the spool limit bounds).

    Databases, snapshot manifests and code files are not counted: they are
    small, stay in the staging directory, and the uploader cannot free them.
    """
    total = 0
    for root, _, files in os.walk(Path(directory) / CHUNKS_DIR):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except FileNotFoundError:
                pass
    return total


class Uploader:
    """Uploads a local staging directory to a store while the producer keeps recording into it.

    For ``mneme record -rdb s3://...``: the agent commits recordings into
    ``staging_dir`` (a LocalStore, with :class:`mneme.format.writer.RecordingWriter`),
    calls :meth:`notify` after each commit, :meth:`wait_for_space` before
    writing a new instance, and :meth:`close` at the end. A background thread
    pushes whatever is committed (incrementally: a recording whose database is
    unchanged since the last pass costs no request), then deletes the
    uploaded chunks from the staging directory, which is what keeps the spool
    (the chunk bytes waiting for upload) within ``spool_limit`` bytes. Databases, snapshot and code files stay
    (they are small); a chunk deleted locally and needed again is simply
    written again by the producer, or found at the destination.

    Network trouble never loses data: a failed pass is retried with backoff for
    as long as the uploader runs; meanwhile the producer waits in
    :meth:`wait_for_space` once the spool is full (back-pressure instead of a
    full disk). If the agent dies, ``mneme push --resume STAGING URL`` finishes
    the upload later.
    """

    def __init__(
        self,
        staging_dir: str | os.PathLike[str],
        destination: Store | str,
        *,
        spool_limit: int | None = None,
        workers: int = DEFAULT_WORKERS,
        retry: RetryPolicy = RetryPolicy(attempts=4),
        retry_pass_max_s: float = 60.0,
        poll_interval_s: float = 2.0,
        prune: bool = True,
        progress: bool | None = False,
    ):
        self.staging_dir = Path(staging_dir)
        self.destination = as_store(destination)
        self.spool_limit = spool_limit
        self._source = open_store(self.staging_dir)
        self._workers, self._retry, self._prune, self._progress = workers, retry, prune, progress
        self._retry_pass_max_s, self._poll_interval_s = retry_pass_max_s, poll_interval_s
        self._cond = threading.Condition()
        self._wake = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self.last_error: BaseException | None = None
        self.passes = 0
        self.total = TransferReport(self._source.url, self.destination.url)
        self._sent: dict[str, bytes] = {}

    # -- producer side --
    def start(self) -> "Uploader":
        self._thread = threading.Thread(target=self._run, name="mneme-uploader", daemon=True)
        self._thread.start()
        return self

    def notify(self) -> None:
        """A recording was committed in the staging directory: upload soon."""
        with self._cond:
            self._wake = True
            self._cond.notify_all()

    def spool_bytes(self) -> int:
        return spool_bytes(self.staging_dir)

    def wait_for_space(self, timeout: float | None = None) -> bool:
        """Block while the spool holds more than ``spool_limit`` bytes; False if ``timeout`` ran out first.

        Raises MnemeError if the uploader stopped on a permanent error (nothing would ever free space).
        """
        if self.spool_limit is None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self.spool_bytes() > self.spool_limit:
                self._raise_failure()
                self._wake = True
                self._cond.notify_all()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(timeout=min(remaining or 1.0, 1.0))
        return True

    def close(self, timeout: float | None = None) -> TransferReport:
        """Upload everything committed so far, stop the thread, and return the totals.

        Raises the last error if the final pass could not complete (the staging
        directory is intact: ``mneme push --resume`` it later).
        """
        with self._cond:
            self._closing = True
            self._wake = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise MnemeError(
                    f"upload of {self.staging_dir} to {self.destination.url} did not finish within {timeout} s; "
                    f"finish it with `mneme push --resume {self.staging_dir} {self.destination.url}`"
                )
        self._raise_failure()
        return self.total

    def __enter__(self) -> "Uploader":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            with self._cond:
                self._closing = True
                self._cond.notify_all()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise MnemeError(
                f"uploading {self.staging_dir} to {self.destination.url} failed: {self._failure}; the staging "
                f"directory is intact: `mneme push --resume {self.staging_dir} {self.destination.url}`"
            ) from self._failure

    # -- uploader thread --
    def _run(self) -> None:
        backoff = self._retry.initial_delay_s
        while True:
            with self._cond:
                if not self._wake and not self._closing:
                    self._cond.wait(timeout=self._poll_interval_s)
                closing, self._wake = self._closing, False
            try:
                self._one_pass()
                backoff = self._retry.initial_delay_s
                self.last_error = None
            except StoreUnavailableError as exc:  # the network or the server is down: try again later
                self.last_error = exc
                if closing:
                    self._failure = exc
                    return
                with self._cond:  # sleep, but wake at once for close()
                    self._cond.wait_for(lambda: self._closing, timeout=backoff)
                backoff = min(backoff * 2, self._retry_pass_max_s)
                continue
            except BaseException as exc:  # a real error (corrupt staging, refused credentials): stop
                self._failure = self.last_error = exc
                with self._cond:
                    self._cond.notify_all()
                return
            with self._cond:
                self._cond.notify_all()
            if closing:
                return

    def _one_pass(self) -> None:
        if not self.staging_dir.is_dir():
            return  # the producer has not created it yet
        report = transfer(self._source, self.destination, resume=True, workers=self._workers,
                          retry=self._retry, progress=self._progress, sent=self._sent)
        self.passes += 1
        for key in ("chunks_copied", "chunks_present", "objects_copied", "objects_present", "bytes_copied"):
            setattr(self.total, key, getattr(self.total, key) + getattr(report, key))
        self.total.committed += [n for n in report.committed if n not in self.total.committed]
        if self._prune:
            self._prune_uploaded(report.committed)

    def _prune_uploaded(self, databases: Sequence[str]) -> None:
        """Delete from staging the chunks of recordings whose database the destination now holds."""
        for name in databases:
            try:
                contents = read_recording(self._source, name, self._retry)
            except ArtifactError:
                continue  # being rewritten by the producer right now; next pass
            if contents.raw != self._sent.get(name):
                continue  # the producer committed more since this pass read it: upload first
            for chunk in contents.chunk_names:
                self._source.delete(chunk)
