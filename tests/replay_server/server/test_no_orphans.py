"""No process outlives the one that started it: a client's local servers, a server's compile processes
and workers, whichever way their parent ends (SIGKILL included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc

from replay_server.protocol import replay_pb2, replay_pb2_grpc
from replay_server.testing.servers import RECORD_DB, start_server, store, subprocess_env  # noqa: F401


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped has ended)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"


def wait_gone(pids: set[int], seconds: float = 10.0) -> set[int]:
    """The pids still running after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return {p for p in pids if alive(p)}


def test_a_server_killed_leaves_no_compile_process_or_worker(store, tmp_path):
    process, address = start_server(store, tmp_path / "log", "--workers", "2", "--compile-processes", "2")
    try:
        stub = replay_pb2_grpc.ReplayServiceStub(grpc.insecure_channel(address))
        stub.Prepare(replay_pb2.PrepareRequest(instance=replay_pb2.InstanceRef(record_db=RECORD_DB, record_id="456")),
                     timeout=30)  # every compile process has started and read the instance
        spawned = children(process.pid)
        assert len(spawned) >= 4, spawned  # 2 workers, 2 compile processes (and the resource tracker)
    finally:
        process.kill()
        process.wait()
    assert not wait_gone(spawned), "processes of the killed server still run"


CLIENT = textwrap.dedent("""
    import os, sys
    from replay_server.client.connection import ConnectionSettings
    from replay_server.client.executor import AsyncReplayExecutor
    executor = AsyncReplayExecutor({db!r}, "456", iterations=1, connection=ConnectionSettings(
        local_gpus=[0], engine="replay_server.testing.fake_engine:spec_from_env", server_env={env!r}))
    assert executor.evaluate({{"block": {{"x": 64}}}}).verified
    print(" ".join(str(s.process.pid) for s in executor._local_servers.servers), flush=True)
    os.kill(os.getpid(), int(sys.argv[1]))
""")


def test_a_client_killed_leaves_no_local_server(store, tmp_path):
    """The executor's local servers stop when their client dies, even by SIGKILL (which runs no cleanup)."""
    script = tmp_path / "client.py"
    script.write_text(CLIENT.format(db=str(store / RECORD_DB),
                                    env=subprocess_env(tmp_path / "log")))
    client = subprocess.run([sys.executable, str(script), str(int(signal.SIGKILL))], capture_output=True, text=True,
                            timeout=120, env={**os.environ, **subprocess_env(tmp_path / "log")})
    assert client.returncode == -signal.SIGKILL, client.stderr[-2000:]
    servers = {int(p) for p in client.stdout.split()}
    assert servers and not wait_gone(servers), "the killed client's servers still run"
