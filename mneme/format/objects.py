"""References to whole objects (code files, snapshot files): name, SHA-256 and size, verified on read."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from mneme.errors import ArtifactError
from mneme.format.layout import is_sha256_hex
from mneme.format.schema import JsonReader
from mneme.store.base import InvalidNameError, Store, validate_name


@dataclass(frozen=True)
class ObjectRef:
    """An object of a recording directory as the database names it."""

    path: str
    sha256: str
    size: int

    @classmethod
    def of(cls, name: str, data: bytes | memoryview) -> "ObjectRef":
        return cls(name, hashlib.sha256(data).hexdigest(), len(data))

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "size": self.size}

    @classmethod
    def parse(cls, r: JsonReader, value: Any, where: str) -> "ObjectRef":
        d = r.obj(value, where, required=("path", "sha256", "size"))
        path = r.str(d["path"], f"{where}.path")
        try:
            validate_name(path)
        except InvalidNameError as exc:
            raise r.error(f"{where}.path", str(exc)) from None
        if not is_sha256_hex(d["sha256"]):
            raise r.error(f"{where}.sha256", f"{d['sha256']!r} is not a SHA-256 hex digest")
        size = r.int(d["size"], f"{where}.size", 0)
        return cls(path, d["sha256"], size)

    def read(self, store: Store, what: str = "") -> bytes:
        """The object's bytes, checked against size and SHA-256."""
        label = f"{what} {self.path}".strip()
        try:
            data = store.get(self.path)
        except ArtifactError:
            if store.exists(self.path):
                raise
            raise ArtifactError(f"{label} not found in {store.url}; the recording is incomplete") from None
        self.verify(data, store, what)
        return data

    def verify(self, data: bytes | memoryview, store: Store, what: str = "") -> None:
        label = f"{what} {self.path}".strip()
        if len(data) != self.size:
            raise ArtifactError(
                f"{label} in {store.url} has {len(data)} bytes, the recording database says {self.size}; "
                "the file is truncated or was replaced"
            )
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise ArtifactError(
                f"{label} in {store.url} does not match the SHA-256 in the recording database; the file is corrupt"
            )
