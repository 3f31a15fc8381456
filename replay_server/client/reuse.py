"""Finding kept local replay servers a run can use instead of starting its own.

:mod:`replay_server.kept_servers` says what a kept server is and where it announces itself; this is
the client's half: which announced servers match a run (this host and user, the same mneme, engine,
devices and store, the recording in it), each asked for its ``ServerInfo`` before it is used.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mneme._internal.child_process import PACKAGE_ROOT
from mneme._internal.names import validate_store_key
from mneme.errors import ConfigurationError
from replay_server.kept_servers import (
    PROBE_TIMEOUT_S,
    TOKEN_FILE,
    code_signature,
    normal_engine,
    private_dir,
    spread_workers,
)

log = logging.getLogger("replay_server.client.reuse")


@dataclass
class ReusedServers:
    """Kept servers a run uses in place of its own local servers (the interface of
    :class:`replay_server.client.local_servers.LocalServers` the executor needs); never stopped by it."""

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
    try:
        return validate_store_key("/".join(relative.parts))
    except ConfigurationError:  # not a key a server accepts
        return None


def _candidates(directory: Path, record_db: str, engine_spec: str) -> list[tuple[object, str]]:
    """(announcement, record key) of the live kept servers of this user that could serve ``record_db``;
    announcements of servers that are gone are deleted."""
    files = list(directory.glob("server-*.json"))
    if not files:  # (a plain run's usual case: nothing more to import or read)
        return []
    from mneme import __version__
    from replay_server.discovery import Announcement

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
    from replay_server.protocol import replay_pb2, replay_pb2_grpc

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
            from mneme._internal.devices import visible_gpu_count as gpu_count
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
