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
* announces itself in that directory (:mod:`replay_server.discovery`'s format and
  lease, with the fields below), and withdraws the announcement when it stops;
* exits after ``--keep-alive`` seconds without a call (``replay_server.server.idle``).

A later ``mneme tune`` without ``--servers``/``--servers-from``
(:func:`replay_server.client.reuse.find_reusable`) uses live servers that match: this host and user,
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
import secrets
import stat
from pathlib import Path
from typing import Sequence

from mneme._internal.cache_dir import cache_root
from mneme._internal.child_process import PACKAGE_ROOT
from mneme.errors import ConfigurationError

log = logging.getLogger("replay_server.kept_servers")

#: How long a server left running waits for work before it exits, unless told otherwise.
DEFAULT_KEEP_ALIVE_S = 600.0
#: Shortest keep-alive: a tuner connects within a second of finding the server.
MIN_KEEP_ALIVE_S = 1.0
#: How long a tuner waits for a found server's ServerInfo before it starts its own servers.
PROBE_TIMEOUT_S = 1.0
TOKEN_FILE = "token"


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
    code is not reused."""
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
    """The announcement fields of a kept server (``replay_server.discovery.Announcement``) besides its address."""
    return {
        "store": str(Path(store).resolve()), "engine_spec": normal_engine(engine_spec),
        "package_root": PACKAGE_ROOT, "code_signature": code_signature(), "uid": os.getuid(),
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "token_file": str(token_path),
        "keep_alive_s": keep_alive,
    }


#: How many replay servers share this host's CPUs: set by the client that starts one server per GPU
#: (``replay_server.client.local_servers``); a server sizes its compile pool by its share (unset: one).
SERVERS_ON_HOST_ENV = "MNEME_SERVERS_ON_HOST"


def spread_workers(workers: int, gpus: int) -> list[int]:
    """Workers per GPU: ``workers`` spread over ``gpus`` as evenly as possible, the first ones first."""
    return [workers // gpus + (1 if i < workers % gpus else 0) for i in range(gpus)]


def describe(servers: Sequence[tuple[int, int]], keep_alive: float) -> str:
    """One line for the user about servers left running: (pid, gpu) each."""
    which = ", ".join(f"pid {pid} on GPU {gpu}" for pid, gpu in servers)
    return (f"left {len(servers)} local replay server(s) running for the next `mneme tune` ({which}); each exits "
            f"after {keep_alive:g} s without work, or stop it now with `kill PID`")
