"""A store in a local directory: object ``a/b`` is the file ``<root>/a/b``.

Writes go to a hidden temporary file in the destination directory and are
renamed over the destination (``os.replace``), so a killed writer or a
concurrent reader never sees a partial object, whatever the durability.

``durability`` says what survives a machine crash (power loss, kernel panic):

* ``"object"`` (the default): every object is fsync'ed, and its directory
  after the rename, before ``put`` returns.
* ``"commit"``: no fsync per object; ``make_durable()`` (one ``syncfs`` of the
  store's file system) makes everything written so far durable at once, and
  ``make_durable(name)`` one object (fsync of the file and its directory): for
  writers that produce GBs faster than the disk takes them and commit a
  database now and then (``mneme record --durable``).
* ``"none"``: no fsync at all; the kernel writes the objects back when it
  will. A killed process still leaves only complete objects (renames); a
  machine crash may leave the newest objects empty or missing, which readers
  detect (chunks are verified against their names, other objects against the
  database). What ``mneme record`` uses by default (docs/recording.md).

``sync=True`` / ``sync=False`` are the older spellings of ``"object"`` and ``"commit"``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import tempfile
import threading
from pathlib import Path
from typing import Iterator, Sequence

from mneme.errors import ArtifactError
from mneme.store.base import InvalidNameError, Store, validate_name, validate_prefix

#: What survives a machine crash: every object (fsync each), what a commit made durable, nothing guaranteed.
DURABILITIES = ("object", "commit", "none")
#: Most buffers one ``writev`` call takes (Linux's IOV_MAX).
_IOV_MAX = 1024


class LocalStore(Store):
    """Objects as files under ``root`` (created on the first write).

    Args:
        root: the directory (``~`` expanded; made absolute).
        sync: the older spelling: True for ``"object"``, False for ``"commit"`` durability.
        durability: ``"object"`` (default), ``"commit"`` or ``"none"``: what survives a machine crash.

    Raises:
        ValueError: both ``sync`` and ``durability``, or an unknown durability.
    """

    def __init__(self, root: str | os.PathLike[str], *, sync: bool | None = None, durability: str | None = None):
        self._root = Path(root).expanduser().absolute()
        self._root_text = str(self._root)
        if durability is None:
            durability = "commit" if sync is False else "object"
        elif sync is not None:
            raise ValueError("give durability or sync, not both")
        if durability not in DURABILITIES:
            raise ValueError(f"durability {durability!r} is not one of {', '.join(DURABILITIES)}")
        self.durability = durability
        self._directories: set[str] = set()  # directories this store has made (no mkdir per object)
        self._serial = 0
        self._serial_lock = threading.Lock()

    @property
    def sync(self) -> bool:
        """Whether every object is fsync'ed as it is written (``durability == "object"``)."""
        return self.durability == "object"

    @property
    def root(self) -> Path:
        """The directory, absolute."""
        return self._root

    @property
    def url(self) -> str:
        """The directory as text (what error messages name)."""
        return str(self._root)

    def _path(self, name: str) -> Path:
        return self._root.joinpath(*validate_name(name).split("/"))

    def local_path(self, name: str) -> Path:
        """The file of object ``name`` (it may not exist yet).

        Args:
            name: the object's name.

        Returns:
            The file's path.
        """
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
        self.put_parts(name, (data,))

    def put_parts(self, name: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """Store the concatenation of ``parts`` as object ``name``, atomically, without joining them.

        One ``writev`` per 1024 parts into a hidden temporary file, renamed into
        place: the kernel copies the bytes straight from the callers' buffers
        (a raw chunk frame's blocks are views of the mapped spool file), and
        every system call runs without the GIL.

        Args:
            name: the object's name.
            parts: the pieces, in order.
        """
        folder, path = self._locate(name)
        self._write_atomically(folder, path, lambda fd: _write_all(fd, parts))

    def put_file(self, name: str, path: str | Path) -> None:
        """Copy a local file in, in 1 MiB pieces (no whole-file buffer).

        Args:
            name: the object's name.
            path: the local file.

        Raises:
            ArtifactError: the file does not exist, or the write failed.
        """
        source = Path(path)
        if not source.is_file():
            raise ArtifactError(f"cannot store {name}: source file {source} does not exist")

        def copy(fd: int) -> None:
            with source.open("rb") as src:
                while piece := src.read(1 << 20):
                    _write_all(fd, (piece,))

        self._write_atomically(*self._locate(name), copy)

    def _locate(self, name: str) -> tuple[str, str]:
        """The directory and the file of object ``name`` (strings: no ``Path`` per object)."""
        validate_name(name)
        directory, _, base = name.rpartition("/")
        folder = f"{self._root_text}/{directory}" if directory else self._root_text
        return folder, f"{folder}/{base}"

    def _write_atomically(self, folder: str, path: str, write) -> None:
        """``write(fd)`` into a hidden temporary file of ``folder``, then rename it to ``path``."""
        fd, tmp = self._temporary(folder, os.path.basename(path))
        try:
            try:
                write(fd)
                if self.durability == "object":
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise ArtifactError(f"cannot write {path}: {_reason(exc)}") from exc
            raise
        if self.durability == "object":
            _fsync_directory(Path(folder))

    def _temporary(self, folder: str, base: str) -> tuple[int, str]:
        """A new hidden temporary file ``.<base>.<pid>-<n>.tmp`` in ``folder`` (made the first time), open for writing."""
        with self._serial_lock:
            self._serial += 1
            serial = self._serial
        tmp = f"{folder}/.{base}.{os.getpid()}-{serial}.tmp"
        for attempt in range(2):
            if folder not in self._directories:
                try:
                    os.makedirs(folder, exist_ok=True)
                except OSError as exc:
                    raise ArtifactError(f"cannot write {exc.filename or folder}: {_reason(exc)}") from exc
                self._directories.add(folder)
            try:
                return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), tmp
            except FileExistsError:  # left by a killed writer whose pid this one has now: a fresh name
                try:
                    return tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=folder)
                except OSError as exc:
                    raise ArtifactError(f"cannot write {folder}: {_reason(exc)}") from exc
            except FileNotFoundError as exc:  # the directory was removed since this store made it
                self._directories.discard(folder)
                if attempt:
                    raise ArtifactError(f"cannot write {folder}: {_reason(exc)}") from exc
            except OSError as exc:
                raise ArtifactError(f"cannot write {folder}: {_reason(exc)}") from exc
        raise AssertionError("unreachable")

    def make_durable(self, name: str | None = None) -> None:
        """``"commit"`` durability: every object written so far (``syncfs``), or only ``name`` and its directory entry.

        A no-op for the other durabilities.

        Args:
            name: one object (None: every object written so far).

        Raises:
            ArtifactError: the fsync failed.
        """
        if self.durability != "commit":
            return
        if name is None:
            if self._root.is_dir():
                _sync_file_system(self._root)
            return
        path = self._path(name)
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise ArtifactError(f"cannot make {path} durable (fsync): {_reason(exc)}") from exc
        _fsync_directory(path.parent)

    def exists(self, name: str) -> bool:
        validate_name(name)
        return os.path.isfile(f"{self._root_text}/{name}")

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


def _write_all(fd: int, parts: Sequence[bytes | bytearray | memoryview]) -> None:
    """Write ``parts`` to ``fd`` in order: ``writev`` calls of at most ``_IOV_MAX`` buffers, short writes resumed."""
    if len(parts) <= _IOV_MAX:  # the common case: one call, no Python per buffer
        total = sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in parts)
        written = os.writev(fd, parts) if total else 0
        if written == total:
            return
        skip = written
    else:
        skip = 0
    pending = [memoryview(p).cast("B") for p in parts if len(p)]
    while skip:  # what the first call wrote
        if skip >= len(pending[0]):
            skip -= len(pending.pop(0))
        else:
            pending[0], skip = pending[0][skip:], 0
    while pending:
        batch = pending[:_IOV_MAX]
        written = os.writev(fd, batch)
        if written <= 0:
            raise OSError(errno.EIO, "write returned no bytes")
        if written == sum(len(p) for p in batch):
            del pending[: len(batch)]
            continue
        while written:  # a short write (a signal, a full disk's last bytes): drop what went out, retry the rest
            first = pending[0]
            if written >= len(first):
                written -= len(first)
                pending.pop(0)
            else:
                pending[0] = first[written:]
                written = 0


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
