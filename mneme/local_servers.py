"""Local replay servers: one ``mneme serve`` subprocess per local GPU, on free loopback ports.

``AsyncReplayExecutor(servers=None)`` starts them itself. A caller that knows
early that it will need them (``mneme tune``, before it has read the
recording and built its space) starts them with :meth:`LocalServers.start`
and hands them over (``AsyncReplayExecutor(local_servers=...)``): the
servers, their workers (CUDA context, self-test) and the caller's own set-up
then overlap instead of running one after the other.

Each server is reachable only with a random per-set token, stops when its
parent process is gone (``--parent-pid``, even after a SIGKILL), and imports
the same mneme as its parent (:mod:`mneme.child_process`).
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
from typing import Mapping, Sequence

from mneme.child_process import child_env, mneme_command
from mneme.errors import ConfigurationError, NotAvailableError
from mneme.startup_trace import mark


def split_database(record_db: str) -> tuple[str, str]:
    """(store, key): the database's directory (or URL prefix) and its name there."""
    trimmed = record_db.rstrip("/")
    head, sep, name = trimmed.rpartition("/")
    if "://" not in trimmed:
        return str(Path(head or ".").resolve()), name
    return head, name


def local_gpu_count() -> int:
    from replay_server.device_info import visible_gpu_count

    return visible_gpu_count()


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
        cls, gpu: int, workers: int, store: str, token_file: str, log_dir: Path, extra_args: Sequence[str],
        env: Mapping[str, str] | None, watchdog: float,
    ) -> "LocalServer":
        # The server imports the mneme this process did, installed or not, whatever the current directory.
        command = mneme_command(
            "serve", "--gpu", str(gpu), "--port", "0", "--host", "127.0.0.1",
            "--store", store, "--workers", str(workers), "--token-file", token_file, "--log-level", "WARNING",
            "--parent-pid", str(os.getpid()),  # a client that dies (even by SIGKILL) leaves no server behind
            *(["--watchdog", str(watchdog)] if watchdog > 0 else []), *extra_args,
        )
        log_path = log_dir / f"server-gpu{gpu}.log"
        with open(log_path, "wb") as log:
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

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def _stop_all(servers: list[LocalServer]) -> None:
    for local in servers:
        local.stop()


class LocalServers:
    """The local servers of one executor: their token, processes and logs (a temporary directory)."""

    def __init__(self) -> None:
        self.token = secrets.token_urlsafe(32)
        self.servers: list[LocalServer] = []
        self._dir = tempfile.TemporaryDirectory(prefix="mneme-servers-")
        self.log_dir = Path(self._dir.name)
        self.token_file = self.log_dir / "token"
        self.token_file.write_text(self.token)
        self.token_file.chmod(0o600)
        # Servers that are never stopped still stop when this object is collected or at exit.
        weakref.finalize(self, _stop_all, self.servers)

    @classmethod
    def start(
        cls, store: str, num_workers: int, local_gpus: Sequence[int] | None = None, *,
        server_args: Sequence[str] = (), server_env: Mapping[str, str] | None = None, watchdog: float = 0.0,
    ) -> "LocalServers":
        """Start one server per GPU of ``local_gpus`` (default: every visible GPU), at most ``num_workers``
        of them, with ``num_workers`` worker processes spread over them; returns without waiting."""
        if num_workers < 1:
            raise ConfigurationError(f"num_workers={num_workers}: at least one worker is needed")
        gpus = list(range(local_gpu_count()) if local_gpus is None else local_gpus)
        if not gpus:
            raise NotAvailableError(
                "no GPU is visible here to start local replay servers; run `mneme serve --gpu N` on a GPU "
                "machine and pass servers=['host:port', ...]"
            )
        gpus = gpus[:num_workers]
        per_gpu = [num_workers // len(gpus) + (1 if i < num_workers % len(gpus) else 0) for i in range(len(gpus))]
        started = cls()
        mark("executor", "spawn")
        try:
            for gpu, workers in zip(gpus, per_gpu):
                started.servers.append(LocalServer.start(
                    gpu, workers, store, str(started.token_file), started.log_dir, server_args, server_env, watchdog,
                ))
        except BaseException:
            started.stop()
            raise
        return started

    def addresses(self, timeout: float) -> list[str]:
        """Wait until every server listens; their ``host:port``s (a server that does not start: an error
        with its log, and every server stopped)."""
        try:
            return [local.wait_address(timeout) for local in self.servers]
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        _stop_all(self.servers)
