"""Where a key a client gives lies in a store URL: a file of a local store, or an object of a remote one.

The replay servers resolve the ``record_db`` keys of requests with these (after
:func:`mneme._internal.names.validate_store_key`); nothing resolves outside the store.
"""

from __future__ import annotations

import stat
from pathlib import Path

from mneme._internal.names import validate_store_key
from mneme.errors import ConfigurationError


def is_local_store(store: str) -> bool:
    return "://" not in store or store.startswith("file://")


def local_store_root(store: str) -> Path:
    return Path(store[len("file://"):] if store.startswith("file://") else store)


def resolve_in_store(store: str, key: str) -> str:
    """The path or URL of a validated ``key`` inside ``store`` (never outside it)."""
    validate_store_key(key)
    if is_local_store(store):
        root = local_store_root(store).resolve()
        target = (root / key).resolve()
        if root != target and root not in target.parents:  # a symlink pointing out of the store
            raise ConfigurationError(f"record_db {key!r} resolves outside the store {store}")
        return str(target)
    return f"{store.rstrip('/')}/{key}"


def store_has(store: str, key: str) -> bool:
    """Whether the store holds ``key`` (local: a file; S3: an object)."""
    if is_local_store(store):
        return Path(resolve_in_store(store, key)).is_file()
    from mneme.store import open_store  # (the S3 backend's module loads only here)

    return open_store(store).exists(key)


def local_revision(store: str, key: str) -> str | None:
    """Which version of a local store's file ``key`` is there now (its modification time, size and inode:
    a database written again, by a new recording into it, is another revision); None when it is not a file."""
    try:
        info = Path(resolve_in_store(store, key)).stat()
    except OSError:
        return None
    return f"{info.st_mtime_ns}-{info.st_size}-{info.st_ino}" if stat.S_ISREG(info.st_mode) else None
