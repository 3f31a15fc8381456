"""Local servers left running for later tuners (replay_server.kept_servers): real `mneme serve --local` and
`mneme tune` processes on loopback with the test engine; each tuner runs the README's launch preset
(13 configurations) on a synthetic vector-add recording."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from mneme._internal.child_process import child_env
from mneme.testing.synthetic import write_vecadd_recording
from replay_server import kept_servers
from replay_server.client import reuse
from replay_server.protocol import replay_pb2, replay_pb2_grpc
from replay_server.testing.servers import ENGINE_ARGS, subprocess_env, wait_for

ENGINE = ENGINE_ARGS[1]
LAUNCH_PRESET = ["--space-preset", "launch", "--launch-dim", "x", "--sampler", "exhaustive"]


@pytest.fixture
def env(tmp_path, monkeypatch):
    """The environment of every process of a test: its own cache directory (so its own servers
    directory), the test engine logging to tmp_path/log."""
    monkeypatch.setenv("MNEME_CACHE_DIR", str(tmp_path / "cache"))
    engine = subprocess_env(tmp_path / "log")
    # The servers and tuners must run the mneme this test imports (an installed one, or the source tree):
    # a kept server is reused only by the same code. child_env leads PYTHONPATH with it where needed.
    del engine["PYTHONPATH"]
    return child_env({**engine, "MNEME_CACHE_DIR": str(tmp_path / "cache")})


@pytest.fixture
def database(tmp_path) -> Path:
    made = write_vecadd_recording(tmp_path / "recordings", n=4096, block=256)
    return tmp_path / "recordings" / made.database


@pytest.fixture
def processes():
    """Processes a test starts; those still running at its end are killed."""
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.kill()
            process.wait(10)


def serve_local(processes, env, store: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """``mneme serve --local`` with the test engine; (process, address) once it is announced."""
    process = subprocess.Popen(
        [sys.executable, "-m", "mneme", "serve", "--local", "--gpu", "0", "--store", str(store),
         "--log-level", "WARNING", *ENGINE_ARGS, *extra],
        stdout=subprocess.PIPE, text=True, env=env, cwd=store, start_new_session=True)
    processes.append(process)
    line = process.stdout.readline()
    assert "listening on" in line, line
    address = line.split("listening on ", 1)[1].split()[0]
    wait_for(lambda: announcement_of(address) is not None, "the server's announcement")
    return process, address


def announcement_of(address: str) -> Path | None:
    found = [p for p in kept_servers.servers_dir().glob("server-*.json")
             if json.loads(p.read_text()).get("address") == address]
    return found[0] if found else None


def tune(env, database: Path, results: Path, *extra: str, wait: bool = True):
    command = [sys.executable, "-m", "mneme", "tune", "-rdb", str(database), *LAUNCH_PRESET,
               "--server-engine", ENGINE, "--results-dir", str(results), *extra]
    if not wait:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                cwd=results.parent)
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=results.parent, timeout=120)


def self_tests(tmp_path: Path) -> int:
    """Workers started so far by every server of the test (the test engine counts its self-tests)."""
    counter = tmp_path / "log" / "starts"
    return int(counter.read_text()) if counter.exists() else 0


def answers(address: str) -> bool:
    token = (kept_servers.servers_dir() / kept_servers.TOKEN_FILE).read_text().strip()
    channel = grpc.insecure_channel(address)
    try:
        replay_pb2_grpc.ReplayServiceStub(channel).GetServerInfo(
            replay_pb2.ServerInfoRequest(), metadata=(("authorization", f"Bearer {token}"),), timeout=5)
        return True
    except grpc.RpcError:
        return False
    finally:
        channel.close()


def verified(results: Path) -> int:
    return json.loads((results / "summary.json").read_text())["verified"]


def test_a_tuner_uses_a_kept_server_and_leaves_it_running(tmp_path, env, database, processes):
    server, address = serve_local(processes, env, database.parent, "--keep-alive", "60")
    wait_for(lambda: self_tests(tmp_path) == 1, "the kept server's worker", 30)
    done = tune(env, database, tmp_path / "run")
    assert done.returncode == 0, done.stderr
    assert f"left running (pid {server.pid})" in done.stdout
    assert verified(tmp_path / "run") == 13
    assert self_tests(tmp_path) == 1, "no other server or worker started"
    assert server.poll() is None and answers(address), "the tuner did not stop the server it reused"
    assert announcement_of(address) is not None


def test_sigint_to_a_tuner_leaves_the_reused_server_running(tmp_path, env, database, processes):
    env["MNEME_FAKE_ENGINE"] = json.dumps({"log_dir": str(tmp_path / "log"), "replay_seconds": 0.2})
    server, address = serve_local(processes, env, database.parent, "--keep-alive", "60")
    tuner = tune(env, database, tmp_path / "run", wait=False)
    processes.append(tuner)
    trials = tmp_path / "run" / "trials.jsonl"
    wait_for(lambda: trials.exists() and trials.read_text().count("\n") >= 2, "two trials", 60)
    tuner.send_signal(signal.SIGINT)
    out, err = tuner.communicate(timeout=60)
    assert tuner.returncode == 130, err
    assert f"left running (pid {server.pid})" in out
    time.sleep(0.5)  # a stop it had been told would have begun by now
    assert server.poll() is None and answers(address)
    assert self_tests(tmp_path) == 1


def test_keep_servers_leaves_the_started_server_for_the_next_run(tmp_path, env, database, processes):
    first = tune(env, database, tmp_path / "first", "--keep-servers", "60")
    assert first.returncode == 0, first.stderr
    assert "left 1 local replay server(s) running" in first.stdout
    (path,) = kept_servers.servers_dir().glob("server-*.json")
    kept = json.loads(path.read_text())
    processes.append(_Pid(kept["pid"]))
    assert kept["keep_alive_s"] == 60 and kept["engine_spec"] == ENGINE
    second = tune(env, database, tmp_path / "second")
    assert second.returncode == 0, second.stderr
    assert f"left running (pid {kept['pid']})" in second.stdout and verified(tmp_path / "second") == 13
    assert self_tests(tmp_path) == 1, "the second run started no server"
    assert answers(kept["address"])


def test_an_unanswering_server_is_passed_over(tmp_path, env, database, processes):
    server, address = serve_local(processes, env, database.parent, "--keep-alive", "60")
    wait_for(lambda: self_tests(tmp_path) == 1, "the kept server's worker", 30)
    server.send_signal(signal.SIGSTOP)  # alive and announced, but it does not answer
    try:
        done = tune(env, database, tmp_path / "run")
    finally:
        server.send_signal(signal.SIGCONT)
    assert done.returncode == 0, done.stderr
    assert "left running" not in done.stdout and verified(tmp_path / "run") == 13
    assert self_tests(tmp_path) == 2, "the tuner started a server of its own"


def test_announcements_of_gone_or_expired_servers_are_ignored_and_removed(tmp_path, env, database, processes):
    server, address = serve_local(processes, env, database.parent, "--keep-alive", "60", "--lease", "300")
    path = announcement_of(address)
    assert reuse.find_reusable(str(database), 1, ENGINE).found == [address]
    expired = json.loads(path.read_text())
    expired["refreshed"] = time.time() - 301
    path.write_text(json.dumps(expired))
    assert reuse.find_reusable(str(database), 1, ENGINE) is None
    assert not path.exists(), "an expired announcement is deleted"

    server2, address2 = serve_local(processes, env, database.parent, "--keep-alive", "60")
    server2.kill()  # killed hard: its announcement stays, live by its lease
    server2.wait(10)
    assert announcement_of(address2) is not None
    assert reuse.find_reusable(str(database), 1, ENGINE) is None
    assert announcement_of(address2) is None


@pytest.mark.parametrize("field, value", [
    ("uid", os.getuid() + 1), ("version", "0.0.0-other"), ("package_root", "/elsewhere"),
    ("code_signature", "0" * 32), ("engine_spec", ""), ("visible_devices", "3"), ("host", "another-host"),
    ("workers", 2), ("store", "/elsewhere"), ("address", "10.1.2.3:50051"), ("token_file", "/etc/hostname"),
])
def test_a_server_that_does_not_match_is_not_used(tmp_path, env, database, processes, field, value):
    server, address = serve_local(processes, env, database.parent, "--keep-alive", "60", "--lease", "300")
    path = announcement_of(address)
    assert reuse.find_reusable(str(database), 1, ENGINE) is not None
    changed = json.loads(path.read_text())
    changed[field] = value
    path.write_text(json.dumps(changed))
    assert reuse.find_reusable(str(database), 1, ENGINE) is None


def test_a_servers_directory_others_can_read_is_not_used(tmp_path, env, database, processes):
    serve_local(processes, env, database.parent, "--keep-alive", "60")
    assert reuse.find_reusable(str(database), 1, ENGINE) is not None
    kept_servers.servers_dir().chmod(0o755)
    assert reuse.find_reusable(str(database), 1, ENGINE) is None


def test_a_database_under_the_servers_store_is_served_by_its_key(tmp_path, env, database, processes):
    server, address = serve_local(processes, env, tmp_path)  # the store holds recordings/<db>
    found = reuse.find_reusable(str(database), 1, ENGINE)
    assert found.record_key == f"recordings/{database.name}"
    done = tune(env, database, tmp_path / "run")
    assert done.returncode == 0, done.stderr
    assert f"left running (pid {server.pid})" in done.stdout and verified(tmp_path / "run") == 13


def test_a_kept_server_exits_after_its_idle_time(tmp_path, env, database, processes):
    server, address = serve_local(processes, env, database.parent, "--keep-alive", "1.5")
    path = announcement_of(address)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:  # calls keep it
        assert answers(address)
        time.sleep(0.3)
    assert server.poll() is None
    assert server.wait(timeout=15) == 0  # no more calls: it stops by itself
    assert not path.exists(), "its announcement is withdrawn"


def test_local_refuses_settings_it_decides(tmp_path, env):
    done = subprocess.run([sys.executable, "-m", "mneme", "serve", "--local", "--gpu", "0", "--store", str(tmp_path),
                           "--host", "0.0.0.0"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and "--local decides --host" in done.stderr


class _Pid:
    """A process this test did not start as a child (a server a tuner left running), for ``processes``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self):
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return 0
        return None

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float) -> None:
        wait_for(lambda: self.poll() is not None, f"pid {self.pid} to end", timeout)
