"""Validation of what clients name: store keys and record ids.

A request can only name objects inside the server's configured store: keys
are relative, '/'-separated, made of safe characters, with no '..', empty or
hidden components; record ids are the decimal or hex hashes the recorder
writes. Anything else is refused before it reaches a worker.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

from mneme.errors import ConfigurationError

_KEY_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_RECORD_ID = re.compile(r"^[A-Za-z0-9_\-]{1,128}$")
MAX_KEY_LENGTH = 1024


def validate_store_key(key: str) -> str:
    """Return ``key`` when it names an object inside the store, else raise ConfigurationError."""
    if not key:
        raise ConfigurationError("record_db is empty; name the recording database by its store key, e.g. '1234.json'")
    if len(key) > MAX_KEY_LENGTH:
        raise ConfigurationError(f"record_db is longer than {MAX_KEY_LENGTH} characters")
    if key.startswith("/") or "\\" in key or "\x00" in key:
        raise ConfigurationError(
            f"record_db {key!r} must be a key relative to the server's store (no absolute paths)"
        )
    for part in key.split("/"):
        if part in ("", ".", "..") or not _KEY_COMPONENT.match(part):
            raise ConfigurationError(
                f"record_db {key!r} is not a valid store key: components must be non-empty, not hidden, "
                "no '..', letters, digits, '_', '-', '.' only"
            )
    return key


def validate_record_id(record_id: str) -> str:
    if not _RECORD_ID.match(record_id or ""):
        raise ConfigurationError(
            f"record_id {record_id!r} is not a recorded instance id (the dynamic hash: letters and digits)"
        )
    return record_id


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
    from mneme.store import open_store  # the S3 backend lives there

    return open_store(store).exists(key)


def local_revision(store: str, key: str) -> str | None:
    """Which version of a local store's file ``key`` is there now (its modification time, size and inode:
    a database written again, by a new recording into it, is another revision); None when it is not a file."""
    try:
        info = Path(resolve_in_store(store, key)).stat()
    except OSError:
        return None
    return f"{info.st_mtime_ns}-{info.st_size}-{info.st_ino}" if stat.S_ISREG(info.st_mode) else None
