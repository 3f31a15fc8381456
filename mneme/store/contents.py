"""What a store holds: its recording databases, what each one needs, chunk checks and object ages.

The helpers every store verb (transfer, cleanup, summary, uploader) builds on.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence, Union

import zstandard

from mneme.errors import ArtifactError
from mneme.format.chunks import MAX_CHUNK_SIZE, ChunkRef
from mneme.format.content_hash import digest_matches
from mneme.format.database import RecordingDatabase, parse_database_bytes
from mneme.format.objects import ObjectRef
from mneme.format.snapshot import read_snapshot
from mneme.store import Store, open_store
from mneme.store.base import ObjectInfo
from mneme.store.retry import RetryPolicy, with_retries

#: What store operations accept for a store: a Store, a directory path or an s3:// URL.
Location = Union[Store, str, "os.PathLike[str]"]

DATABASE_NAME = re.compile(r"[0-9]{1,20}\.json")


def as_store(store_or_url: Location) -> Store:
    return store_or_url if isinstance(store_or_url, Store) else open_store(store_or_url)


def existing_store(store_or_url: Location) -> Store:
    """The store at ``store_or_url``, after checking that a directory store exists (for ls, check, gc, sources).

    Writing verbs create a missing directory; reading ones must not take a
    typo for an empty store. (An S3 store's listing says when its bucket is
    missing; an empty prefix is an empty store.)

    Args:
        store_or_url: a Store, a directory path or an ``s3://bucket/prefix`` URL.

    Returns:
        The opened store.

    Raises:
        ArtifactError: ``no store at <path>: <reason>`` when the directory is missing or not a directory.
    """
    store = as_store(store_or_url)
    root = getattr(store, "root", None)
    if isinstance(root, Path):
        try:
            if not stat.S_ISDIR(root.stat().st_mode):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(root))
        except OSError as exc:
            raise ArtifactError(f"no store at {store.url}: {exc.strerror or exc}; check the path") from None
    return store


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


def chunk_problem(blob: bytes, digest: str, length: int | None = None, algorithm: str | None = None) -> str | None:
    """What is wrong with ``blob`` as the stored chunk of content ``digest``, or None when it is intact.

    The zstd frame must declare at most ``length`` bytes (the snapshot's
    length, when known; checked before anything is allocated), decompress to
    exactly that many, and the content must hash to ``digest``.

    Args:
        blob: the stored (compressed) bytes.
        digest: the chunk's name (the hash of its content, hex).
        length: the content length the snapshot records, if known.
        algorithm: the hash the snapshot names its chunks by (``"blake3"``, ``"sha256"``); None (only the
            name is known): either (:func:`mneme.format.content_hash.digest_matches`).

    Returns:
        ``corrupt: ...`` saying what failed, or None.
    """
    declared = zstandard.frame_content_size(blob) if len(blob) >= 4 else -2
    limit = MAX_CHUNK_SIZE if length is None else length
    if declared == -2 or declared > limit or (length is not None and declared not in (-1, length)):
        snapshot = "" if length is None else f", the snapshot says {length}"
        return f"corrupt: its header declares {declared} bytes{snapshot}"
    try:
        piece = zstandard.ZstdDecompressor().decompress(blob, max_output_size=max(limit, 1))
    except zstandard.ZstdError as exc:
        return f"corrupt (zstd: {exc})"
    if (length is not None and len(piece) != length) or not digest_matches(piece, digest, algorithm):
        return "corrupt: its content does not match its name"
    return None


def check_chunk_blob(blob: bytes, digest: str, what: str, length: int | None = None, algorithm: str | None = None) -> None:
    """Raise ArtifactError (``<what> is corrupt...``) unless ``blob`` is the intact chunk ``digest``.

    See :func:`chunk_problem` for what is checked.
    """
    problem = chunk_problem(blob, digest, length, algorithm)
    if problem is not None:
        raise ArtifactError(f"{what} is {problem}")


def verified_chunk(store: Store, ref: ChunkRef) -> bytes:
    """The stored (compressed) bytes of chunk ``ref``, after checking they decompress to its content."""
    blob = store.get(ref.name)
    check_chunk_blob(blob, ref.digest, f"chunk {ref.name} in {store.url}", ref.length, ref.algorithm)
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
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise ArtifactError(f"cannot read {name} from {store.url}: {exc.strerror or exc}") from exc
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
