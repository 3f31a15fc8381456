"""Deleting from a store: ``clean`` (whole recordings) and ``gc`` (objects no database references).

Both keep the commit order of the format in reverse (databases first) and
never delete what a database still names; gc keeps anything younger than its
grace period, which is what makes it safe beside uploads in progress. See docs/store.md.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

from mneme.errors import ArtifactError
from mneme.format.database import load_database
from mneme.format.layout import CHUNKS_DIR
from mneme.store import Store
from mneme.store.contents import (
    Location,
    database_names,
    existing_store,
    list_info,
    object_info,
    read_recording,
    select_databases,
)
from mneme.store.retry import RetryPolicy, with_retries

#: Objects a recording consists of besides its database (what gc may remove when nothing names them).
RECORDING_OBJECT = re.compile(
    r"chunks/[0-9a-f]{2}/[0-9a-f]{64}"
    r"|DeviceState\.(prologue|epilogue)\.[0-9]{1,20}\.[0-9]{1,20}\.mneme"
    r"|Kernel_[0-9]{1,20}\.(ptx|cubin)"
    r"|RecordedIR_[0-9]{1,20}\.bc"
)
#: gc keeps unreferenced objects younger than this (seconds): they may belong to an upload in progress.
DEFAULT_GC_GRACE_S = 3600.0


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

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (``mneme gc/clean/move --json``): every field of the summary line."""
        return asdict(self)


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
    store = existing_store(store_or_url)
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
    store = existing_store(store_or_url)
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
