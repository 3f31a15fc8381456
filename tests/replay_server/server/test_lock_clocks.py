"""``mneme serve --lock-clocks``: the server's GPU locked while it serves and put back when it stops, or
one line saying why not; the flag reaches the local servers a tuner starts."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

import pytest

from mneme.cli import build_parser
from mneme.errors import ConfigurationError
from mneme.testing.fake_nvml import PCI_BUS_ID, install
from mneme.testing.gpu import gpu_unavailable_reason
from replay_server.client.connection import ConnectionSettings
from replay_server.server.clocks import ServerClocks
from replay_server.server.serve import ServerOptions
from replay_server.testing.servers import ENGINE_ARGS, make_server, store, subprocess_env  # noqa: F401

HANDLE = f"handle:{PCI_BUS_ID}"


def test_the_flag_parses_and_defaults_to_off():
    parser = build_parser()
    assert parser.parse_args(["serve", "--gpu", "0"]).lock_clocks == "off"
    assert parser.parse_args(["serve", "--gpu", "0", "--lock-clocks", "max"]).lock_clocks == "max"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--gpu", "0", "--lock-clocks", "turbo"])
    with pytest.raises(ConfigurationError, match="--lock-clocks 'turbo'"):
        ServerOptions(lock_clocks="turbo").validate()


def test_off_touches_nothing(monkeypatch):
    fake = install(monkeypatch)
    clocks = ServerClocks(0, "off")
    assert clocks.lock() == "" and not fake.calls
    clocks.restore()
    assert not fake.calls


def test_a_server_locks_its_gpu_while_it_serves_and_restores_it_when_it_stops(store, tmp_path, monkeypatch):
    fake = install(monkeypatch)
    server = make_server(store, tmp_path / "log", lock_clocks="max")
    server.start()
    try:
        assert fake.called("nvmlDeviceSetGpuLockedClocks") == [(HANDLE, 1980, 1980)]
        assert fake.called("nvmlDeviceSetMemoryLockedClocks") == [(HANDLE, 2619, 2619)]
        assert server.clocks_line == "clocks locked at max: SM 1980 MHz and memory 2619 MHz until it stops"
        assert not fake.called("nvmlDeviceResetGpuLockedClocks")
    finally:
        server.stop()
    assert fake.called("nvmlDeviceResetGpuLockedClocks") == [(HANDLE,)]
    assert fake.called("nvmlDeviceResetMemoryLockedClocks") == [(HANDLE,)]
    server.stop()  # a second stop restores nothing twice
    assert len(fake.called("nvmlDeviceResetGpuLockedClocks")) == 1


def test_a_server_that_fails_to_start_restores_the_clocks(store, tmp_path, monkeypatch):
    fake = install(monkeypatch)
    first = make_server(store, tmp_path / "log")
    port = first.start()
    try:
        second = make_server(store, tmp_path / "log2", port=port, lock_clocks="base")
        with pytest.raises(ConfigurationError, match="port is taken"):
            second.start()
        assert len(fake.called("nvmlDeviceSetGpuLockedClocks")) == 1
        assert len(fake.called("nvmlDeviceResetGpuLockedClocks")) == 1
    finally:
        first.stop()


def test_not_permitted_is_said_once_and_the_server_serves(store, tmp_path, monkeypatch, caplog):
    fake = install(monkeypatch)
    fake.fail["nvmlDeviceSetGpuLockedClocks"] = 4
    with caplog.at_level(logging.WARNING):
        server = make_server(store, tmp_path / "log", lock_clocks="max")
        server.start()
        server.stop()
        again = ServerClocks(0, "max")
        assert again.lock() == "" and "not permitted" in again.problem
    said = [r.getMessage() for r in caplog.records if "--lock-clocks" in r.getMessage()]
    assert len(said) == 1 and "not permitted" in said[0] and "Insufficient Permissions" in said[0]
    assert server.clocks_line == "" and not fake.called("nvmlDeviceResetGpuLockedClocks")


def test_without_nvml_the_server_says_why_once(monkeypatch, caplog):
    fake = install(monkeypatch)
    fake.fail["nvmlInit"] = 12
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            assert ServerClocks(0, "base").lock() == ""
    said = [r.getMessage() for r in caplog.records if "--lock-clocks" in r.getMessage()]
    assert said == ["--lock-clocks base: the clocks are not locked: NVML did not initialize: NVML Shared Library "
                    "Not Found (NVML error 12)"]


def test_mneme_serve_on_this_machine_says_once_and_stops_on_sigterm(store, tmp_path):
    """A real `mneme serve --lock-clocks max` process: where locking cannot be done (this machine has no
    GPU; a GPU host without root refuses it), one line on stderr says why, and it serves."""
    process = subprocess.Popen(
        [sys.executable, "-m", "replay_server", "--gpu", "0", "--port", "0", "--host", "127.0.0.1",
         "--store", str(store), "--log-level", "WARNING", "--lock-clocks", "max", *ENGINE_ARGS],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **subprocess_env(tmp_path / "log")})
    try:
        line = process.stdout.readline()
        assert "listening on" in line, line
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0
    said = [line for line in err.splitlines() if "--lock-clocks" in line]
    locked = "clocks locked at max" in line
    assert locked or (len(said) == 1 and "the clocks are not locked" in said[0]), (line, err)


def test_local_servers_get_the_flag_and_kept_servers_do_not_mix_with_it():
    assert ConnectionSettings(lock_clocks="base").local_server_args() == ["--lock-clocks", "base"]
    assert ConnectionSettings(engine="m:f", lock_clocks="max", server_args=["--watchdog", "3"]).local_server_args() \
        == ["--engine", "m:f", "--lock-clocks", "max", "--watchdog", "3"]
    assert ConnectionSettings().local_server_args() == []
    with pytest.raises(ConfigurationError, match="lock_clocks='fast'"):
        ConnectionSettings(lock_clocks="fast")
    with pytest.raises(ConfigurationError, match="locked clocks"):
        ConnectionSettings(lock_clocks="max", keep_alive=600)


def test_the_executors_local_servers_start_with_the_flag(store, tmp_path):
    from mneme.model.experiment import ExperimentConfiguration
    from replay_server.client.executor import AsyncReplayExecutor
    from replay_server.testing.servers import RECORD_DB, RECORD_ID

    connection = ConnectionSettings(engine=ENGINE_ARGS[1], server_env=subprocess_env(tmp_path / "log"),
                                    lock_clocks="base")
    with AsyncReplayExecutor(str(store / RECORD_DB), RECORD_ID, connection=connection) as executor:
        (server,) = executor._local_servers.servers
        args = list(server.process.args)
        assert args[args.index("--lock-clocks") + 1] == "base"
        assert executor.evaluate(ExperimentConfiguration()).verified  # served, locked or not
        log = (executor._local_servers.log_dir / "server-gpu0.log").read_text()
    said = [line for line in log.splitlines() if "--lock-clocks" in line]
    assert len(said) <= 1  # locked (a GPU host as root), or one line saying why not
    if gpu_unavailable_reason():  # this machine: NVML is not there
        assert len(said) == 1 and "--lock-clocks base: the clocks are not locked: NVML" in said[0], log
