"""The store interface: a flat namespace of named, immutable-once-written objects.

Every backend (a local directory, S3/MinIO) offers the same few operations so
that the recorder, the replay servers and the tuner never care where a
recording lives. Names are checked on *every* call by :func:`validate_name`
(:mod:`mneme._internal.names`):
names can come from clients over the network, and a name must never reach
outside the store (no ``..``, no absolute paths, no hidden files).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from mneme._internal.names import (  # the one rule for object names, re-exported here
    MAX_COMPONENT_LENGTH,
    MAX_NAME_LENGTH,
    InvalidNameError,
    validate_name,
    validate_prefix,
)
from mneme.errors import ArtifactError, MnemeError

__all__ = ["MAX_COMPONENT_LENGTH", "MAX_NAME_LENGTH", "InvalidNameError", "ObjectInfo", "Store",
           "StoreUnavailableError", "validate_name", "validate_prefix"]

class StoreUnavailableError(MnemeError):
    """The store could not be reached (network down, server gone): worth retrying later."""


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing says about one object: its name, size and last-modified time (POSIX seconds)."""

    name: str
    size: int
    modified: float


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
        """The bytes of object ``name``.

        Args:
            name: the object's name.

        Returns:
            Its bytes.

        Raises:
            ArtifactError: no such object (``not_found``).
        """

    @abc.abstractmethod
    def put(self, name: str, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` as object ``name``, atomically, replacing any previous object.

        Args:
            name: the object's name (``validate_name``'s rules).
            data: the bytes.
        """

    @abc.abstractmethod
    def exists(self, name: str) -> bool:
        """Whether object ``name`` exists.

        Args:
            name: the object's name.

        Returns:
            True when it exists.
        """

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[str]:
        """Names of the objects starting with ``prefix``, sorted.

        Args:
            prefix: the names' start ('' for all).

        Returns:
            An iterator of names.
        """

    @abc.abstractmethod
    def delete(self, name: str) -> None:
        """Remove object ``name`` (no error if it does not exist).

        Args:
            name: the object's name.
        """

    @abc.abstractmethod
    def size(self, name: str) -> int:
        """The size in bytes of object ``name``.

        Args:
            name: the object's name.

        Returns:
            The size in bytes.

        Raises:
            ArtifactError: no such object.
        """

    def local_path(self, name: str) -> Path | None:
        """The file that holds object ``name`` for backends that have files, else ``None``.

        Lets local readers ``mmap`` or hand a path to native code instead of copying.

        Args:
            name: the object's name.

        Returns:
            The file's path, or None.
        """
        validate_name(name)
        return None

    def put_file(self, name: str, path: str | Path) -> None:
        """Store the contents of a local file as object ``name`` (backends may stream).

        Args:
            name: the object's name.
            path: the local file.
        """
        self.put(name, Path(path).read_bytes())

    def put_parts(self, name: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """Store the concatenation of ``parts`` as object ``name`` (a local store writes them without joining).

        Args:
            name: the object's name.
            parts: the pieces, in order.
        """
        self.put(name, b"".join(parts))

    def make_durable(self, name: str | None = None) -> None:
        """Make every object written so far (``name``: that object) survive an OS crash.

        For backends whose puts are not durable each (a local store with ``"commit"`` durability); a no-op elsewhere.

        Args:
            name: one object (None: every object written so far).
        """

    def not_found(self, name: str) -> ArtifactError:
        """The error for a missing object: names it and the store, and says what to check.

        Args:
            name: the missing object's name.

        Returns:
            The error, to raise.
        """
        return ArtifactError(f"{name} not found in {self.url}; check the recording path")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
