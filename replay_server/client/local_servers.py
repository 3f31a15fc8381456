"""Local replay servers: one ``mneme serve`` subprocess per local GPU, on free loopback ports.

``AsyncReplayExecutor(servers=None)`` starts them itself. A caller that knows
early that it will need them (``mneme tune``, before it has read the
recording and built its space) starts them with :meth:`LocalServers.start`
and hands them over (``AsyncReplayExecutor(local_servers=...)``): the
servers, their workers (CUDA context, self-test) and the caller's own set-up
then overlap instead of running one after the other.

Each server is reachable only with a random per-set token, stops when its
parent process is gone (``--parent-pid``, even after a SIGKILL), and imports
the same mneme as its parent (:mod:`mneme._internal.child_process`). Servers started
to stay (``keep_alive``: ``mneme tune --keep-servers``) are the exception:
they are ``mneme serve --local --keep-alive S`` servers (this user's token,
announced for later runs: :mod:`replay_server.kept_servers`), outlive their parent,
and ``stop()`` leaves them running.
"""

from __future__ import annotations

import os
import queue
import secrets
import subprocess
import tempfile
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from mneme._internal.child_process import child_env, mneme_command
from mneme._internal.startup_trace import mark
from mneme.errors import ConfigurationError, NotAvailableError
from replay_server.kept_servers import SERVERS_ON_HOST_ENV, spread_workers

if TYPE_CHECKING:
    from replay_server.client.connection import ConnectionSettings


def split_database(record_db: str) -> tuple[str, str]:
    """(store, key): the database's directory (or URL prefix) and its name there."""
    trimmed = record_db.rstrip("/")
    head, sep, name = trimmed.rpartition("/")
    if "://" not in trimmed:
        return str(Path(head or ".").resolve()), name
    return head, name


def local_gpu_count() -> int:
    from mneme._internal.devices import visible_gpu_count

    return visible_gpu_count()


NO_GPU = ("no GPU is visible here to start local replay servers; run `mneme serve --gpu N` on a GPU machine "
          "and pass servers=['host:port', ...]")


class LocalServer:
    """A ``mneme serve`` subprocess on one local GPU, on a free loopback port."""

    def __init__(self, gpu: int, process: subprocess.Popen, log_path: Path) -> None:
        self.gpu = gpu
        self.process = process
        self.log_path = log_path
        self._address: "queue.Queue[str | None]" = queue.Queue()
        threading.Thread(target=self._read_stdout, daemon=True).start()

    @classmethod
    def start(
        cls, gpu: int, workers: int, store: str, access_args: Sequence[str], log_dir: Path,
        extra_args: Sequence[str], env: Mapping[str, str] | None, watchdog: float,
    ) -> "LocalServer":
        # The server imports the mneme this process did, installed or not, whatever the current directory.
        command = mneme_command(
            "serve", "--gpu", str(gpu), "--store", store, "--workers", str(workers), "--log-level", "WARNING",
            *access_args, *(["--watchdog", str(watchdog)] if watchdog > 0 else []), *extra_args,
        )
        log_path = log_dir / f"server-gpu{gpu}.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=log, text=True, env=child_env(env), start_new_session=True,
            )
        return cls(gpu, process, log_path)

    def _read_stdout(self) -> None:
        for line in self.process.stdout:
            if "listening on " in line:
                self._address.put(line.split("listening on ", 1)[1].split()[0])
        self._address.put(None)

    def wait_address(self, timeout: float) -> str:
        try:
            address = self._address.get(timeout=timeout)
        except queue.Empty:
            address = None
        if address is None:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            raise NotAvailableError(
                f"the local replay server for GPU {self.gpu} did not start (log {self.log_path}):\n{tail}"
            )
        return address

    def stop(self, wait: bool = True) -> None:
        """SIGTERM; with ``wait``, wait for the exit (SIGKILL after 15 s)."""
        if self.process.poll() is None:
            self.process.terminate()
        if wait:
            self.wait()

    def wait(self) -> None:
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


def _stop_all(servers: list[LocalServer], wait: bool = True) -> None:
    for local in servers:  # all told first: they stop side by side
        local.stop(wait=False)
    if wait:
        for local in servers:
            local.wait()


class LocalServers:
    """The local servers of one executor: their token, processes and logs (a temporary directory; for
    servers kept for later runs, this user's servers directory)."""

    reused = False  # (replay_server.client.reuse.ReusedServers: servers found running)

    def __init__(self, wait_on_stop: bool = True, keep_alive: float = 0.0) -> None:
        self.wait_on_stop = wait_on_stop
        self.keep_alive = keep_alive
        self.servers: list[LocalServer] = []
        if keep_alive:
            from replay_server.kept_servers import private_dir, token_file

            self.token_file = token_file()
            self.token = self.token_file.read_text().strip()
            self.log_dir = private_dir(create=True)
            self._access = ["--local", "--keep-alive", f"{keep_alive:g}"]
            return
        self.token = secrets.token_urlsafe(32)
        self._dir = tempfile.TemporaryDirectory(prefix="mneme-servers-")
        self.log_dir = Path(self._dir.name)
        self.token_file = self.log_dir / "token"
        self.token_file.write_text(self.token)
        self.token_file.chmod(0o600)
        self._access = ["--port", "0", "--host", "127.0.0.1", "--token-file", str(self.token_file),
                        "--parent-pid", str(os.getpid())]  # a client that dies (even by SIGKILL) leaves none
        # Servers that are never stopped still stop when this object is collected or at exit (told to stop,
        # and, unless ``wait_on_stop`` is False, waited for: a command's exit does not wait for their teardown).
        weakref.finalize(self, _stop_all, self.servers, wait_on_stop)

    @classmethod
    def start(
        cls, store: str, num_workers: int, local_gpus: Sequence[int] | None = None, *,
        server_args: Sequence[str] = (), server_env: Mapping[str, str] | None = None, watchdog: float = 0.0,
        wait_on_stop: bool = True, keep_alive: float = 0.0,
    ) -> "LocalServers":
        """Start one server per GPU of ``local_gpus`` (default: every visible GPU), at most ``num_workers``
        of them, with ``num_workers`` worker processes spread over them; returns without waiting for them.

        Without ``local_gpus`` the server of GPU 0 starts at once, while the GPUs are counted (that
        initializes CUDA in this process); with none it is stopped again and the error says so.
        ``wait_on_stop=False``: ``stop()`` tells the servers to stop and returns (a command that exits
        right after, like ``mneme tune``, need not wait for their GPU teardown; they also stop when it
        is gone). ``keep_alive`` > 0: the servers stay after ``stop()`` and this process, for later runs, and
        exit after that many seconds without a call (:mod:`replay_server.kept_servers`)."""
        if num_workers < 1:
            raise ConfigurationError(f"num_workers={num_workers}: at least one worker is needed")
        started = cls(wait_on_stop, keep_alive)
        mark("executor", "spawn")
        try:
            if local_gpus is None:  # GPU 0's server starts before the count (there is a GPU 0 if any)
                started._start(0, num_workers, store, server_args, server_env, watchdog)
                gpus = list(range(local_gpu_count()))[:num_workers]
            else:
                gpus = list(local_gpus)[:num_workers]
            if not gpus:
                raise NotAvailableError(NO_GPU)
            shares = list(zip(gpus, spread_workers(num_workers, len(gpus))))
            if started.servers and shares[0] != (0, num_workers):  # GPU 0 gets only its share: restart it
                started.servers.pop().stop()
            shared = {**(server_env or {}), SERVERS_ON_HOST_ENV: str(len(shares))}  # (the pools' share of the CPUs)
            for gpu, workers in shares[1 if started.servers else 0:]:
                started._start(gpu, workers, store, server_args, shared, watchdog)
        except BaseException:
            _stop_all(started.servers)  # (and wait: nothing of a failed start outlives it)
            raise
        return started

    @classmethod
    def start_with(cls, store: str, num_workers: int, connection: "ConnectionSettings", *, watchdog: float = 0.0,
                   wait_on_stop: bool = True) -> "LocalServers":
        """:meth:`start` with the local-server options of ``connection`` (GPUs, ``mneme serve`` arguments and
        environment, a test engine, ``keep_alive``).

        Args:
            store: the store the servers read (the recording database's directory or URL prefix).
            num_workers: worker processes, spread over the servers.
            connection: the executor's connection settings.
            watchdog: the servers' per-replay watchdog (0: their default).
            wait_on_stop: whether ``stop()`` waits for the servers to exit.

        Returns:
            The servers, started (not waited for: :meth:`addresses` waits).
        """
        return cls.start(store, num_workers, connection.local_server_gpus(), server_args=connection.local_server_args(),
                         server_env=connection.server_env, watchdog=watchdog, wait_on_stop=wait_on_stop,
                         keep_alive=connection.keep_alive)

    def _start(self, gpu: int, workers: int, store: str, server_args: Sequence[str],
               server_env: Mapping[str, str] | None, watchdog: float) -> LocalServer:
        server = LocalServer.start(gpu, workers, store, self._access, self.log_dir, server_args, server_env, watchdog)
        self.servers.append(server)
        return server

    def addresses(self, timeout: float) -> list[str]:
        """Wait until every server listens; their ``host:port``s (a server that does not start: an error
        with its log, and every server stopped)."""
        try:
            return [local.wait_address(timeout) for local in self.servers]
        except BaseException:
            _stop_all(self.servers)  # (kept ones too: a set that did not start is no use to a later run)
            raise

    def stop(self) -> None:
        """Tell the servers to stop; servers kept for later runs (``keep_alive``) stay."""
        if not self.keep_alive:
            _stop_all(self.servers, wait=self.wait_on_stop)

    def describe_kept(self) -> str:
        """For the user: which servers stay, and for how long ("" when none)."""
        from replay_server.kept_servers import describe

        return describe([(s.process.pid, s.gpu) for s in self.servers], self.keep_alive) if self.keep_alive else ""
