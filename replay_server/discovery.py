"""Replay servers that announce themselves, and tuners that find them.

``mneme serve --announce LOCATION`` writes one small JSON object into LOCATION
(a directory on a shared filesystem, or an ``s3://bucket/prefix``: any
:func:`mneme.store.open_store` location) saying where the server listens, which
GPU it drives, its mneme version and its health, and rewrites it every third of
its lease; it deletes the object when it stops. ``mneme tune --servers-from
LOCATION`` uses every server whose announcement is live (refreshed within its
lease, and SERVING), connects to servers that announce themselves later, and
sends no more work to one whose lease ran out (what that server still held is
answered, or retried elsewhere when it is gone).

A lease is judged by the announcement's own time stamp against the reader's
clock: the nodes' clocks must agree to well within a lease (NTP does that; the
default lease is 30 s).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

from mneme.errors import ConfigurationError, NotAvailableError

log = logging.getLogger("replay_server.discovery")

PREFIX = "server-"
DEFAULT_LEASE_S = 30.0
#: How often a tuner looks for servers that joined or left.
WATCH_INTERVAL_S = 2.0
SERVING = "SERVING"


@dataclass
class Announcement:
    """What one server says about itself (the JSON object's fields)."""

    address: str
    gpu: int
    gpu_name: str = ""
    version: str = ""
    health: str = SERVING
    workers: int = 1
    engine: str = ""
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    lease_s: float = DEFAULT_LEASE_S
    refreshed: float = 0.0  # time.time() of the last write
    # What a tuner of the same user needs to reuse a local server left running (replay_server.kept_servers);
    # empty for servers announced with --announce.
    store: str = ""  # the store it serves (a local directory, resolved)
    engine_spec: str = ""  # its --engine argument ("" or "cuda": the CUDA engine)
    package_root: str = ""  # the directory its mneme was imported from
    code_signature: str = ""  # replay_server.kept_servers.code_signature() of that code
    uid: int = -1  # the user it runs as
    visible_devices: str | None = None  # its CUDA_VISIBLE_DEVICES (None: not set)
    token_file: str = ""  # the bearer token its clients present
    keep_alive_s: float = 0.0  # it exits after this long without a call (0: runs until stopped)

    @property
    def name(self) -> str:
        """The object's name in the location: one per server address and GPU."""
        return f"{PREFIX}{re.sub(r'[^A-Za-z0-9._-]', '_', self.address)}-gpu{self.gpu}.json"

    def live(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        return self.health == SERVING and now < self.refreshed + self.lease_s

    @classmethod
    def from_json(cls, data: bytes) -> "Announcement":
        doc = json.loads(data)
        known = {k: v for k, v in doc.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def _store(location: str):
    from mneme.store import open_store

    if not location:
        raise ConfigurationError("give a directory or an s3://bucket/prefix for server announcements")
    store = open_store(location)
    root = getattr(store, "root", None)
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
    return store


def read_announcements(location: str) -> list[Announcement]:
    """Every announcement in ``location`` (live or not); unreadable objects are skipped."""
    store = _store(location)
    found = []
    for name in store.list(PREFIX):
        if "/" in name or not name.endswith(".json"):
            continue
        try:
            found.append(Announcement.from_json(store.get(name)))
        except Exception as exc:  # noqa: BLE001 - deleted meanwhile, or half-written by a foreign tool
            log.debug("skipping announcement %s: %s", name, exc)
    return found


def live_servers(location: str, now: float | None = None) -> list[str]:
    """The addresses of the live servers announced in ``location``, sorted."""
    return sorted({a.address for a in read_announcements(location) if a.live(now)})


def wait_for_servers(location: str, timeout: float = 60.0) -> list[str]:
    """The live servers of ``location``, waiting up to ``timeout`` seconds for the first one."""
    deadline = time.monotonic() + timeout
    while True:
        servers = live_servers(location)
        if servers or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if not servers:
        raise NotAvailableError(
            f"no live replay server is announced in {location} (waited {timeout:g}s); start servers with "
            f"`mneme serve --gpu N --announce {location}`, or give --servers HOST:PORT"
        )
    return servers


class Announcer:
    """Keeps one server's announcement in ``location`` fresh until :meth:`stop` deletes it.

    ``describe()`` returns the announcement's current content (its health
    changes while the server runs); it is written at once, then every
    ``lease_s / 3`` seconds.
    """

    def __init__(self, location: str, describe: Callable[[], Announcement]) -> None:
        self.location = location
        self.describe = describe
        self._store = _store(location)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._name: str | None = None

    def write(self) -> Announcement:
        announcement = self.describe()
        announcement.refreshed = time.time()
        self._name = announcement.name
        self._store.put(self._name, json.dumps(asdict(announcement), indent=1).encode())
        return announcement

    def start(self) -> Announcement:
        first = self.write()
        self._thread = threading.Thread(target=self._refresh, args=(first.lease_s / 3,),
                                        name="mneme-announce", daemon=True)
        self._thread.start()
        return first

    def _refresh(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                self.write()
            except Exception as exc:  # noqa: BLE001 - a flaky store: keep trying, the lease covers a miss
                log.warning("could not refresh the announcement in %s: %s", self.location, exc)

    def stop(self) -> None:
        """Stop refreshing and delete the announcement (tuners drop the server at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._name is not None:
            try:
                self._store.delete(self._name)
            except Exception as exc:  # noqa: BLE001 - it expires by itself
                log.warning("could not delete the announcement %s: %s", self._name, exc)


class ServerWatcher:
    """Follows ``location`` for an executor: ``on_join(address)`` for each server that becomes live,
    ``on_leave(address)`` for each whose announcement expired or went away."""

    def __init__(self, location: str, known: Iterable[str], on_join: Callable[[str], Any],
                 on_leave: Callable[[str], Any], interval: float = WATCH_INTERVAL_S) -> None:
        self.location = location
        self.current = set(known)
        self.on_join = on_join
        self.on_leave = on_leave
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mneme-discovery", daemon=True)

    def start(self) -> "ServerWatcher":
        self._thread.start()
        return self

    def poll(self) -> tuple[list[str], list[str]]:
        """One look: (joined, left), after telling the executor."""
        live = set(live_servers(self.location))
        joined, left = sorted(live - self.current), sorted(self.current - live)
        for address in left:
            log.info("replay server %s left %s (lease expired or stopped)", address, self.location)
            self.on_leave(address)
            self.current.discard(address)
        for address in joined:
            log.info("replay server %s joined through %s", address, self.location)
            try:
                self.on_join(address)
            except Exception as exc:  # noqa: BLE001 - not reachable yet: try again next time
                log.warning("cannot use replay server %s yet: %s", address, exc)
                continue
            self.current.add(address)
        return joined, left

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - the location is briefly unreadable: keep the servers
                log.warning("cannot read server announcements in %s: %s", self.location, exc)

    def stop(self) -> None:
        self._stop.set()


def follow(executor: Any, location: str, interval: float = WATCH_INTERVAL_S) -> ServerWatcher:
    """Keep ``executor`` (an :class:`~replay_server.client.executor.AsyncReplayExecutor`) on the live servers of
    ``location``; the watcher stops with the executor's ``shutdown``."""
    watcher = ServerWatcher(location, executor.servers, executor.add_server, executor.retire_server, interval)
    executor.on_shutdown(watcher.stop)
    return watcher.start()
