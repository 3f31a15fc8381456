"""A local, content-addressed cache in front of a remote store, for the replay servers.

A replay server opens recordings with ``cached_store(url)`` instead of
``open_store(url)``. Chunks (``chunks/<2 hex>/<sha256>``, the bulk of every
snapshot) are named by the hash of their content, so a cached copy can never
be stale: the first read of a chunk fetches it from the remote store, checks
it against its name, and keeps it under ``cache_dir``; every later read, by
any server process on the machine, comes from the local disk. Databases,
snapshot manifests and code files are small and may be rewritten when
recordings are merged, so they are always read from the remote store (the
format readers check them against the SHA-256 the database records).

The cache is a :class:`mneme.store.local.LocalStore` laid out like a
recording directory (writes are atomic, so several processes can share one
cache directory, e.g. a docker volume). ``max_bytes`` bounds it: when a fill
takes it past the bound, the least recently used chunks are evicted.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Iterator

from mneme._internal.cache_dir import cache_root
from mneme.errors import ArtifactError
from mneme.store import LocalStore, Store, open_store
from mneme.store.base import validate_name
from mneme.store.contents import check_chunk_blob

_CHUNK = re.compile(r"chunks/[0-9a-f]{2}/([0-9a-f]{64})")


def default_cache_dir() -> Path:
    return cache_root() / "store"


class CachedStore(Store):
    """``remote`` with its chunks cached, verified, in ``cache_dir``; everything else passes through."""

    def __init__(self, remote: Store, cache_dir: str | os.PathLike[str], max_bytes: int | None = None):
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.remote = remote
        self.cache = LocalStore(cache_dir)
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._approx_bytes: int | None = None

    @property
    def url(self) -> str:
        return self.remote.url

    # -- reads: chunks from the cache, filled on a miss --
    def get(self, name: str) -> bytes:
        match = _CHUNK.fullmatch(validate_name(name))
        if match is None:
            return self.remote.get(name)
        path = self.cache.local_path(name)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            pass
        else:
            with self._lock:
                self.hits += 1
            _touch(path)
            return data
        data = self.remote.get(name)
        try:
            check_chunk_blob(data, match.group(1), f"chunk {name} in {self.remote.url}")
        except ArtifactError as exc:
            raise ArtifactError(f"{exc}; it was not cached") from None
        self.cache.put(name, data)
        with self._lock:
            self.misses += 1
        self._account(len(data))
        return data

    def exists(self, name: str) -> bool:
        if _CHUNK.fullmatch(validate_name(name)) and self.cache.exists(name):
            return True
        return self.remote.exists(name)

    def size(self, name: str) -> int:
        if _CHUNK.fullmatch(validate_name(name)) and self.cache.exists(name):
            return self.cache.size(name)
        return self.remote.size(name)

    def local_path(self, name: str) -> Path | None:
        """The cached file of a chunk once it has been read (else None: the object is remote)."""
        if _CHUNK.fullmatch(validate_name(name)) and self.cache.exists(name):
            return self.cache.local_path(name)
        return None

    def list(self, prefix: str = "") -> Iterator[str]:
        return self.remote.list(prefix)

    # -- writes go to the remote store (the cache only ever holds verified copies of remote chunks) --
    def put(self, name: str, data: bytes | bytearray | memoryview) -> None:
        self.remote.put(name, data)

    def put_file(self, name: str, path: str | Path) -> None:
        self.remote.put_file(name, path)

    def delete(self, name: str) -> None:
        self.remote.delete(name)
        if _CHUNK.fullmatch(validate_name(name)):
            self.cache.delete(name)

    # -- size bound --
    def cached_bytes(self) -> int:
        """Bytes of the chunks in the cache directory (a scan)."""
        return sum(size for _, size, _ in self._entries())

    def _entries(self) -> list[tuple[Path, int, float]]:
        entries = []
        for name in self.cache.list("chunks/"):
            path = self.cache.local_path(name)
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            entries.append((path, st.st_size, st.st_mtime))
        return entries

    def _account(self, added: int) -> None:
        if self.max_bytes is None:
            return
        with self._lock:
            if self._approx_bytes is None:
                self._approx_bytes = self.cached_bytes()
            else:
                self._approx_bytes += added
            if self._approx_bytes <= self.max_bytes:
                return
            self._approx_bytes = self.evict(self.max_bytes * 9 // 10)

    def evict(self, target_bytes: int) -> int:
        """Delete least recently used chunks until the cache holds at most ``target_bytes``; return its size."""
        entries = sorted(self._entries(), key=lambda e: e[2])
        total = sum(size for _, size, _ in entries)
        for path, size, _ in entries:
            if total <= target_bytes:
                break
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            total -= size
        return total


def _touch(path: Path) -> None:
    """Mark a chunk as recently used (LRU eviction goes by modification time)."""
    try:
        os.utime(path)
    except OSError:
        pass


def cached_store(
    url: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    max_bytes: int | None = None,
) -> Store:
    """The store at ``url`` with a local chunk cache (``cache_dir``, default ``$MNEME_CACHE_DIR`` or
    ``~/.cache/mneme/store``). A local directory needs no cache and is returned as it is.
    """
    remote = open_store(url)
    if isinstance(remote, LocalStore):
        return remote
    return CachedStore(remote, cache_dir if cache_dir is not None else default_cache_dir(), max_bytes)
