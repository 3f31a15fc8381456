"""A store in a local directory: object ``a/b`` is the file ``<root>/a/b``.

Writes go to a hidden temporary file in the destination directory, are
fsync'ed and then renamed over the destination (``os.replace``), so a crash or
a concurrent reader never sees a partial object. ``sync=False`` leaves out the
per-object fsyncs (the rename stays atomic, so a killed process or a concurrent
reader still never sees a partial object) and makes objects durable in batches
instead, when the writer calls ``make_durable`` (one ``syncfs`` of the store's
file system): for writers that produce GBs faster than the disk takes them, as
``mneme record`` does before it commits each database (docs/recording.md).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterator

from mneme.errors import ArtifactError
from mneme.store.base import InvalidNameError, Store, validate_name, validate_prefix


class LocalStore(Store):
    """Objects as files under ``root`` (created on the first write)."""

    def __init__(self, root: str | os.PathLike[str], *, sync: bool = True):
        self._root = Path(root).expanduser().absolute()
        self.sync = sync

    @property
    def root(self) -> Path:
        return self._root

    @property
    def url(self) -> str:
        return str(self._root)

    def _path(self, name: str) -> Path:
        return self._root.joinpath(*validate_name(name).split("/"))

    def local_path(self, name: str) -> Path:
        """The file of object ``name`` (it may not exist yet)."""
        return self._path(name)

    def get(self, name: str) -> bytes:
        path = self._path(name)
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise self.not_found(name) from None
        except IsADirectoryError:
            raise ArtifactError(f"{name} in {self.url} is a directory, not an object") from None
        except OSError as exc:
            raise ArtifactError(f"cannot read {name} from {self.url}: {exc.strerror or exc}") from exc

    def put(self, name: str, data: bytes | bytearray | memoryview) -> None:
        path = self._path(name)
        self._write_atomically(path, lambda f: f.write(data))

    def put_file(self, name: str, path: str | Path) -> None:
        """Copy a local file in, in 1 MiB pieces (no whole-file buffer)."""
        destination = self._path(name)
        source = Path(path)

        def copy(f) -> None:
            with source.open("rb") as src:
                while piece := src.read(1 << 20):
                    f.write(piece)

        if not source.is_file():
            raise ArtifactError(f"cannot store {name}: source file {source} does not exist")
        self._write_atomically(destination, copy)

    def _write_atomically(self, path: Path, write) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ArtifactError(f"cannot write {exc.filename or path.parent}: {_reason(exc)}") from exc
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        except OSError as exc:
            raise ArtifactError(f"cannot write {path.parent}: {_reason(exc)}") from exc
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                if self.sync:
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise ArtifactError(f"cannot write {path}: {_reason(exc)}") from exc
            raise
        if self.sync:
            _fsync_directory(path.parent)

    def make_durable(self) -> None:
        if not self.sync and self._root.is_dir():
            _sync_file_system(self._root)

    def exists(self, name: str) -> bool:
        return self._path(name).is_file()

    def size(self, name: str) -> int:
        path = self._path(name)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            raise self.not_found(name) from None
        except OSError as exc:
            raise ArtifactError(f"cannot read {name} from {self.url}: {exc.strerror or exc}") from exc
        if not stat.S_ISREG(st.st_mode):
            raise ArtifactError(f"{name} in {self.url} is not a regular file")
        return st.st_size

    def delete(self, name: str) -> None:
        try:
            self._path(name).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ArtifactError(f"cannot delete {name} from {self.url}: {exc.strerror or exc}") from exc

    def list(self, prefix: str = "") -> Iterator[str]:
        validate_prefix(prefix)
        # Only walk the directory the prefix points into.
        directory, _, _ = prefix.rpartition("/")
        start = self._root.joinpath(*directory.split("/")) if directory else self._root
        if not start.is_dir():
            return iter(())
        names: list[str] = []
        for dirpath, dirnames, filenames in os.walk(start):
            rel = Path(dirpath).relative_to(self._root).as_posix()
            base = "" if rel == "." else rel + "/"
            # Descend only into directories that can hold a matching name.
            dirnames[:] = [
                d
                for d in dirnames
                if not d.startswith(".") and _compatible(base + d + "/", prefix)
            ]
            for filename in filenames:
                if filename.startswith("."):
                    continue
                name = base + filename
                if name.startswith(prefix) and _is_valid_name(name):
                    names.append(name)
        names.sort()
        return iter(names)


def _reason(exc: OSError) -> str:
    """The OS's reason for a failed write, with what to do about a full disk."""
    hint = "; free some space" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    return f"{exc.strerror or exc}{hint}"


def _is_valid_name(name: str) -> bool:
    """Files whose names no store call accepts (stray files in the directory) are not objects."""
    try:
        validate_name(name)
    except InvalidNameError:
        return False
    return True


def _compatible(directory: str, prefix: str) -> bool:
    """Whether names under ``directory`` (ending in '/') can start with ``prefix``."""
    return directory.startswith(prefix) or prefix.startswith(directory)


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _sync_file_system(directory: Path) -> None:
    """Flush every dirty page of the file system holding ``directory`` (``syncfs``; ``sync`` where it is missing)."""
    syncfs = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
    if syncfs is None:
        os.sync()
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise ArtifactError(f"cannot make {directory} durable (syncfs): {os.strerror(err)}")
    finally:
        os.close(fd)
