"""Local replay servers that stay: started once, reused by the same user's later ``mneme tune`` runs.

A ``mneme tune`` run pays for its local servers before its first result:
the server's and worker's start, the CUDA context, the self-test, restoring
the instance. A user trying things interactively runs the tuner many times
on the same recording, so a server may be left running for the next run:
``mneme serve --local`` (started by hand) or ``mneme tune --keep-servers``
(the servers that run started stay after it). Such a server

* listens on loopback only and wants this user's token (``token``, 0600, in
  this user's servers directory, 0700: another user can neither read the
  token nor the announcements);
* announces itself in that directory (:mod:`mneme.discovery`'s format and
  lease, with the fields below), and withdraws the announcement when it stops;
* exits after ``--keep-alive`` seconds without a call (``replay_server.idle``).

A later ``mneme tune`` without ``--servers``/``--servers-from``
(:func:`find_reusable`) uses live servers that match: this host and user,
the same mneme (version, package directory and a signature of its source
files: the code is the same), the same engine and ``CUDA_VISIBLE_DEVICES``,
a store that holds the recording, and for each GPU the run would use, a
server on it with the workers the run would give it. Each is asked for its
``ServerInfo`` (which must agree) within ``PROBE_TIMEOUT_S``; when one does
not answer, or anything does not match, the run starts its own servers as
before. A reused server is never told to stop by the tuner (nor by its
Ctrl-C: it runs in a session of its own). An announcement whose process is
gone (a server killed hard) is ignored at once and deleted; one whose lease
ran out likewise.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from mneme.cache_dir import cache_root
from mneme.child_process import PACKAGE_ROOT
from mneme.errors import ConfigurationError

log = logging.getLogger("mneme.kept_servers")

#: How long a server left running waits for work before it exits, unless told otherwise.
DEFAULT_KEEP_ALIVE_S = 600.0
#: Shortest keep-alive: a tuner connects within a second of finding the server.
MIN_KEEP_ALIVE_S = 1.0
#: How long a tuner waits for a found server's ServerInfo before it starts its own servers.
PROBE_TIMEOUT_S = 1.0
TOKEN_FILE = "token"
# Store keys a server accepts (replay_server.names): checked here without importing the server.
_KEY_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


def servers_dir() -> Path:
    """Where this user's kept local servers announce themselves."""
    return cache_root() / "servers"


def private_dir(create: bool) -> Path | None:
    """``servers_dir()``, made (0700) when ``create``; None when it does not exist. Raises
    ConfigurationError when it is not this user's alone (another user could read its token)."""
    path = servers_dir()
    if create:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ConfigurationError(
            f"{path} must belong to you alone (owner uid {info.st_uid}, mode {stat.filemode(info.st_mode)}); "
            f"`chmod 700 {path}`, or point MNEME_CACHE_DIR at a private directory")
    return path


def token_file() -> Path:
    """This user's token file for kept servers (made once, 0600)."""
    path = private_dir(create=True) / TOKEN_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32))
    return path


def code_signature(root: str = PACKAGE_ROOT) -> str:
    """A digest of the names, sizes and modification times of the server's source and native files
    (``mneme/``, ``replay_server/`` under ``root``): a server started before an edit of the
    code is not reused. ~1 ms."""
    digest = hashlib.sha256()
    for package in ("mneme", "replay_server"):
        stack = [os.path.join(root, package)]
        while stack:
            directory = stack.pop()
            try:
                entries = sorted(os.scandir(directory), key=lambda e: e.name)
            except OSError:
                continue
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        stack.append(entry.path)
                elif entry.name.endswith((".py", ".so")):
                    info = entry.stat()
                    digest.update(f"{entry.path}\0{info.st_mtime_ns}\0{info.st_size}\n".encode())
    return digest.hexdigest()[:32]


def normal_engine(spec: str | None) -> str:
    """An ``--engine`` argument as announced: "" for the CUDA engine."""
    return "" if spec in (None, "", "cuda") else spec


def identity(store: str, engine_spec: str | None, token_path: Path, keep_alive: float) -> dict:
    """The announcement fields of a kept server (``mneme.discovery.Announcement``) besides its address."""
    return {
        "store": str(Path(store).resolve()), "engine_spec": normal_engine(engine_spec),
        "package_root": PACKAGE_ROOT, "code_signature": code_signature(), "uid": os.getuid(),
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "token_file": str(token_path),
        "keep_alive_s": keep_alive,
    }


def spread_workers(workers: int, gpus: int) -> list[int]:
    """Workers per GPU: ``workers`` spread over ``gpus`` as evenly as possible, the first ones first."""
    return [workers // gpus + (1 if i < workers % gpus else 0) for i in range(gpus)]


@dataclass
class ReusedServers:
    """Kept servers a run uses in place of its own local servers (the interface of
    :class:`mneme.local_servers.LocalServers` the executor needs); never stopped by it."""

    found: list[str]
    token: str
    record_key: str  # the recording database's key in their store
    pids: list[int]
    reused = True

    def addresses(self, timeout: float) -> list[str]:
        return list(self.found)

    def stop(self) -> None:
        """Nothing: a reused server serves other runs after this one, until its keep-alive ends."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process took the pid
        return False
    return True


def _record_key(store: str, record_db: str) -> str | None:
    """The database's key in ``store`` ('/'-separated, as servers accept it), or None when ``store`` does
    not hold it."""
    try:
        relative = Path(record_db).resolve().relative_to(store)
    except ValueError:
        return None
    parts = relative.parts
    if not parts or not all(_KEY_COMPONENT.match(p) for p in parts):
        return None
    return "/".join(parts)


def _candidates(directory: Path, record_db: str, engine_spec: str) -> list[tuple[object, str]]:
    """(announcement, record key) of the live kept servers of this user that could serve ``record_db``;
    announcements of servers that are gone are deleted."""
    files = list(directory.glob("server-*.json"))
    if not files:  # (a plain run's usual case: nothing more to import or read)
        return []
    from mneme import __version__
    from mneme.discovery import Announcement

    now, host, uid = time.time(), socket.gethostname(), os.getuid()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    found, signature = [], None
    for path in files:
        try:
            a = Announcement.from_json(path.read_bytes())
        except (OSError, ValueError, TypeError, AttributeError) as exc:  # deleted meanwhile, or half-written
            log.debug("skipping announcement %s: %s", path, exc)
            continue
        if a.host != host or a.uid != uid:
            continue
        if now >= a.refreshed + a.lease_s or not _alive(a.pid):  # its lease ran out, or killed hard: its file goes
            path.unlink(missing_ok=True)
            continue
        if not a.live(now):  # NOT_SERVING (no worker can start)
            continue
        if (a.version, a.package_root, a.engine_spec, a.visible_devices) != \
                (__version__, PACKAGE_ROOT, normal_engine(engine_spec), visible):
            continue
        if not a.address.startswith("127.0.0.1:") or a.token_file != str(directory / TOKEN_FILE):
            continue  # this user's token goes to loopback servers only, and is read from this directory only
        key = _record_key(a.store, record_db)
        if key is None:
            continue
        signature = signature or code_signature()
        if a.code_signature == signature:
            found.append((a, key))
    return found


def _probe(address: str, token: str, gpu: int, workers: int, store: str) -> bool:
    """Whether the server at ``address`` answers, within PROBE_TIMEOUT_S, as the announcement says."""
    import grpc

    from mneme import __version__
    from mneme._proto import replay_pb2, replay_pb2_grpc

    channel = grpc.insecure_channel(address)
    try:
        info = replay_pb2_grpc.ReplayServiceStub(channel).GetServerInfo(
            replay_pb2.ServerInfoRequest(), metadata=(("authorization", f"Bearer {token}"),),
            timeout=PROBE_TIMEOUT_S)
    except grpc.RpcError as exc:
        log.info("the kept replay server %s did not answer (%s): not reused", address, exc.code().name)
        return False
    finally:
        channel.close()
    same = (info.version, info.gpu, info.workers, info.store) == (__version__, gpu, workers, store)
    if not same:
        log.info("the kept replay server %s is not what it announced: not reused", address)
    return same


def find_reusable(record_db: str, num_workers: int, engine_spec: str | None = None,
                  gpu_count: Callable[[], int] | None = None) -> ReusedServers | None:
    """Kept servers that serve ``record_db`` on the GPUs a run with ``num_workers`` workers would start its
    own on (GPU 0 alone for one worker; else one per visible GPU up to ``num_workers``, the workers spread
    over them), each answering; None when there are none (the run starts its own)."""
    try:
        directory = private_dir(create=False)
    except ConfigurationError as exc:
        log.warning("not reusing kept replay servers: %s", exc)
        return None
    if directory is None:
        return None
    candidates = _candidates(directory, record_db, engine_spec or "")
    if not candidates:
        return None
    if num_workers == 1:
        gpus = [0]
    else:
        if gpu_count is None:
            from mneme.local_servers import local_gpu_count as gpu_count
        gpus = list(range(gpu_count()))[:num_workers]
    if not gpus:
        return None
    chosen: list[tuple[object, str]] = []
    token_cache: dict[str, str] = {}
    for gpu, workers in zip(gpus, spread_workers(num_workers, len(gpus))):
        pick = None
        for a, key in sorted(candidates, key=lambda c: -c[0].refreshed):  # the freshest first
            if a.gpu != gpu or a.workers != workers or (chosen and key != chosen[0][1]):
                continue
            token = token_cache.get(a.token_file) or _read_token(a.token_file)
            if token and _probe(a.address, token, gpu, workers, a.store):
                token_cache[a.token_file] = token
                pick = (a, key)
                break
        if pick is None:
            return None
        chosen.append(pick)
    tokens = {token_cache[a.token_file] for a, _ in chosen}
    if len(tokens) != 1:  # one executor presents one token
        return None
    return ReusedServers([a.address for a, _ in chosen], tokens.pop(), chosen[0][1], [a.pid for a, _ in chosen])


def _read_token(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def describe(servers: Sequence[tuple[int, int]], keep_alive: float) -> str:
    """One line for the user about servers left running: (pid, gpu) each."""
    which = ", ".join(f"pid {pid} on GPU {gpu}" for pid, gpu in servers)
    return (f"left {len(servers)} local replay server(s) running for the next `mneme tune` ({which}); each exits "
            f"after {keep_alive:g} s without work, or stop it now with `kill PID`")
