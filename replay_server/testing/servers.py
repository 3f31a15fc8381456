"""Real replay servers running the test engine, for tests: in-process supervisors with spawned worker
processes, or ``mneme serve`` subprocesses; requests over real gRPC; the ``store`` pytest fixture."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from mneme._internal.child_process import PACKAGE_ROOT
from mneme.model.experiment import ExperimentConfiguration
from replay_server.protocol import replay_pb2, replay_pb2_grpc
from replay_server.protocol.convert import config_to_proto
from replay_server.server.serve import ReplayServer, ServerOptions
from replay_server.testing.fake_engine import FakeEngineSpec

RECORD_DB = "123.json"
RECORD_ID = "456"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    (root / RECORD_DB).write_text("{}")
    (tmp_path / "outside.json").write_text("{}")
    return root


def make_server(store: Path, log_dir: Path, **options) -> ReplayServer:
    log_dir.mkdir(exist_ok=True)
    engine = options.pop("engine", None) or FakeEngineSpec(str(log_dir), fail_starts=options.pop("fail_starts", 0))
    defaults = dict(port=0, host="127.0.0.1", store=str(store), workers=1, watchdog=1.0, engine=engine,
                    compile_processes=1, startup_timeout=20.0)
    defaults.update(options)
    return ReplayServer(ServerOptions(**defaults))


def request(passes: str = "default<O3>", block_x: int = 64, request_id: str = "r", record_db: str = RECORD_DB,
            record_id: str = RECORD_ID, **config) -> replay_pb2.ReplayRequest:
    cfg = ExperimentConfiguration.from_dict({"block": {"x": block_x}, "passes": passes, **config})
    return replay_pb2.ReplayRequest(
        request_id=request_id,
        instance=replay_pb2.InstanceRef(record_db=record_db, record_id=record_id),
        config=config_to_proto(cfg), iterations=3, warmup=2,
    )


def stub_for(port: int) -> replay_pb2_grpc.ReplayServiceStub:
    return replay_pb2_grpc.ReplayServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))


def runs(log_dir: Path) -> list[str]:
    path = log_dir / "runs.log"
    return path.read_text().splitlines() if path.exists() else []


def wait_for(condition, what: str, seconds: float = 10.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``seconds`` (never a fixed sleep:
    a loaded CI machine takes longer)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.01)


ENGINE_ARGS = ["--engine", "replay_server.testing.fake_engine:spec_from_env"]


def subprocess_env(log_dir: Path, **spec) -> dict[str, str]:
    """Environment of a ``mneme serve`` subprocess running the test engine (``spec``: FakeEngineSpec fields)."""
    log_dir.mkdir(exist_ok=True)
    return {
        "MNEME_FAKE_ENGINE": json.dumps({"log_dir": str(log_dir), **spec}),
        "PYTHONPATH": PACKAGE_ROOT,  # the mneme this process runs
    }


def start_server(store: Path, log_dir: Path, *extra: str, **spec) -> tuple[subprocess.Popen, str]:
    """A ``mneme serve`` process with the test engine (``spec``: FakeEngineSpec fields) on a free port;
    (process, address)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "replay_server", "--gpu", "0", "--port", "0", "--host", "127.0.0.1",
         "--store", str(store), "--log-level", "WARNING", *ENGINE_ARGS, *extra],
        stdout=subprocess.PIPE, text=True, env={**os.environ, **subprocess_env(log_dir, **spec)},
    )
    line = process.stdout.readline()
    assert "listening on" in line, line
    return process, line.split("listening on ", 1)[1].split()[0]
