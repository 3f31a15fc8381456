"""Artifact stores: where recordings live (a local directory or S3/MinIO).

``open_store(url)`` picks the backend from the URL; ``split_recording_url``
turns what users pass to ``-rdb`` (``dir/123.json``, ``s3://bucket/p/123.json``,
or just the directory) into a store and the database object name.
"""

from __future__ import annotations

import importlib
import os
from urllib.parse import unquote, urlparse

from mneme.errors import ArtifactError, NotAvailableError
from mneme.store.base import (
    MAX_COMPONENT_LENGTH,
    MAX_NAME_LENGTH,
    InvalidNameError,
    Store,
    validate_name,
    validate_prefix,
)
from mneme.store.local import LocalStore

__all__ = [
    "MAX_COMPONENT_LENGTH",
    "MAX_NAME_LENGTH",
    "InvalidNameError",
    "LocalStore",
    "Store",
    "open_store",
    "split_recording_url",
    "validate_name",
    "validate_prefix",
]

def open_store(url: str | os.PathLike[str]) -> Store:
    """The store at ``url``: a directory path, a ``file://`` URL, or ``s3://bucket/prefix``.

    Args:
        url: a directory path, ``file://`` URL or ``s3://bucket/prefix``.

    Returns:
        A ``LocalStore`` or an ``S3Store``.

    Raises:
        ArtifactError: an empty location, or a URL of another scheme.
        NotAvailableError: an ``s3://`` URL where the S3 backend (minio) is not installed.
    """
    text = os.fspath(url)
    if not isinstance(text, str) or not text:
        raise ArtifactError("a store location is a directory path or an s3://bucket/prefix URL; got nothing")
    scheme = urlparse(text).scheme.lower() if "://" in text else ""
    if scheme == "":
        return LocalStore(text)
    if scheme == "file":
        parsed = urlparse(text)
        if parsed.netloc not in ("", "localhost"):
            raise ArtifactError(f"{text}: file:// URLs must name a local path (file:///dir)")
        return LocalStore(unquote(parsed.path))
    if scheme == "s3":
        try:
            module = importlib.import_module("mneme.store.s3")
        except ImportError as exc:
            raise NotAvailableError(
                f"cannot open {text}: the S3 backend is not available ({exc}); "
                "install mneme with its dependencies (minio) or use a local directory"
            ) from exc
        return module.S3Store(text)
    raise ArtifactError(f"unsupported store URL {text!r}: use a directory path, file:///dir or s3://bucket/prefix")


def split_recording_url(path_or_url: str | os.PathLike[str]) -> tuple[Store, str]:
    """(store, database object name) for a recording given as a ``.json`` path/URL or its directory.

    ``dir/123.json`` and ``s3://bucket/prefix/123.json`` name the database
    directly; a directory (or a prefix URL) is accepted when it holds exactly
    one database.

    Args:
        path_or_url: a database's path or URL, or a directory or prefix URL holding one database.

    Returns:
        ``(store, name)``: the store and the database's object name in it.

    Raises:
        ArtifactError: nothing given, an invalid name, or not exactly one database in the directory.
    """
    text = os.fspath(path_or_url)
    if not text:
        raise ArtifactError("no recording given; pass the path of a <static-hash>.json database")
    trimmed = text.rstrip("/")
    if trimmed.endswith(".json"):
        head, sep, name = trimmed.rpartition("/")
        if not sep:
            head = "."
        elif head == "":
            head = "/"
        elif head.endswith(":/"):
            raise ArtifactError(f"{text}: a URL needs a location before the file name, e.g. s3://bucket/123.json")
        elif head.endswith("://"):
            head += "/"  # file:///123.json -> the root directory
        try:
            validate_name(name)
        except InvalidNameError as exc:
            raise ArtifactError(f"{text}: {exc}") from None
        return open_store(head), name
    store = open_store(text)
    from mneme.format.database import find_databases  # the format builds on the store, not the reverse

    databases = find_databases(store)
    if len(databases) == 1:
        return store, databases[0]
    if not databases:
        raise ArtifactError(
            f"no recording database (<static-hash>.json) in {store.url}; check the recording path"
        )
    raise ArtifactError(
        f"{store.url} holds {len(databases)} recording databases ({', '.join(databases)}); "
        "pass the one you mean, e.g. " + f"{text.rstrip('/')}/{databases[0]}"
    )
