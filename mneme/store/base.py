"""The store interface: a flat namespace of named, immutable-once-written objects.

Every backend (a local directory, S3/MinIO) offers the same few operations so
that the recorder, the replay servers and the tuner never care where a
recording lives. Names are checked on *every* call by :func:`validate_name`:
names can come from clients over the network, and a name must never reach
outside the store (no ``..``, no absolute paths, no hidden files).
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from mneme.errors import ArtifactError, MnemeError

#: Longest accepted object name (S3 keys are limited to 1024 bytes including the prefix).
MAX_NAME_LENGTH = 512
#: Longest accepted path component (common file-system limit).
MAX_COMPONENT_LENGTH = 255
_COMPONENT_CHARS = re.compile(r"[A-Za-z0-9._+=@,~-]+")


class StoreUnavailableError(MnemeError):
    """The store could not be reached (network down, server gone): worth retrying later."""


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing says about one object: its name, size and last-modified time (POSIX seconds)."""

    name: str
    size: int
    modified: float


class InvalidNameError(ArtifactError, ValueError):
    """An object name that is not acceptable to any store (both an ArtifactError and a ValueError)."""


def validate_name(name: str) -> str:
    """Return ``name`` unchanged if it is a safe object name, else raise :class:`InvalidNameError`.

    A name is relative and ``/``-separated; each component is non-empty, does not
    start with a dot (hidden files and ``.``/``..`` are reserved: temporary files
    of atomic writes are hidden), and uses only letters, digits and ``._+=@,~-``.
    """
    if not isinstance(name, str):
        raise InvalidNameError(f"an object name is a string, got {type(name).__name__}")
    if not name:
        raise InvalidNameError("an object name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidNameError(
            f"object name {name[:60]!r}... is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}"
        )
    if "\\" in name:
        raise InvalidNameError(f"object name {name!r} contains a backslash; use '/' to separate components")
    if name.startswith("/"):
        raise InvalidNameError(f"object name {name!r} is absolute; names are relative to the store")
    for component in name.split("/"):
        if not component:
            raise InvalidNameError(f"object name {name!r} has an empty component ('//' or a trailing '/')")
        if component in (".", ".."):
            raise InvalidNameError(f"object name {name!r} contains {component!r}; names cannot leave the store")
        if component.startswith("."):
            raise InvalidNameError(f"object name {name!r} has a hidden component {component!r}")
        if len(component) > MAX_COMPONENT_LENGTH:
            raise InvalidNameError(
                f"object name {name!r} has a component longer than {MAX_COMPONENT_LENGTH} characters"
            )
        if not _COMPONENT_CHARS.fullmatch(component):
            raise InvalidNameError(
                f"object name {name!r} has characters outside letters, digits and '._+=@,~-'"
            )
    return name


def validate_prefix(prefix: str) -> str:
    """A listing prefix: empty, or a name prefix (may end with '/', may stop mid-component)."""
    if prefix == "":
        return prefix
    stripped = prefix[:-1] if prefix.endswith("/") else prefix
    validate_name(stripped)
    return prefix


class Store(abc.ABC):
    """A flat namespace of named objects.

    Contract shared by every backend:

    * ``put`` is atomic: a reader sees the old object, the new one, or none,
      never a partial one.
    * ``get``/``size`` of a missing object raise :class:`ArtifactError` whose
      message names the object and the store (``not_found`` builds it).
    * ``delete`` of a missing object is not an error (concurrent garbage
      collectors may race).
    * ``list`` yields names in sorted order and never hidden/temporary objects.
    """

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """Where this store lives, as a user would type it (a directory path or ``s3://bucket/prefix``)."""

    @abc.abstractmethod
    def get(self, name: str) -> bytes:
        """The bytes of object ``name``."""

    @abc.abstractmethod
    def put(self, name: str, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` as object ``name``, atomically, replacing any previous object."""

    @abc.abstractmethod
    def exists(self, name: str) -> bool:
        """Whether object ``name`` exists."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[str]:
        """Names of the objects starting with ``prefix``, sorted."""

    @abc.abstractmethod
    def delete(self, name: str) -> None:
        """Remove object ``name`` (no error if it does not exist)."""

    @abc.abstractmethod
    def size(self, name: str) -> int:
        """The size in bytes of object ``name``."""

    def local_path(self, name: str) -> Path | None:
        """The file that holds object ``name`` for backends that have files, else ``None``.

        Lets local readers ``mmap`` or hand a path to native code instead of copying.
        """
        validate_name(name)
        return None

    def put_file(self, name: str, path: str | Path) -> None:
        """Store the contents of a local file as object ``name`` (backends may stream)."""
        self.put(name, Path(path).read_bytes())

    def make_durable(self) -> None:
        """Make every object written so far survive an OS crash (backends whose puts are not durable each)."""

    def not_found(self, name: str) -> ArtifactError:
        """The error for a missing object: names it and the store, and says what to check."""
        return ArtifactError(f"{name} not found in {self.url}; check the recording path")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
