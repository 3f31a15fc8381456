"""ConnectionSettings: checked when made, passed whole to the executor (no server needed)."""

from __future__ import annotations

import pytest

from mneme.errors import ConfigurationError
from replay_server.client.connection import HOLD_RESPONSES_SECONDS, ConnectionSettings
from replay_server.client.executor import AsyncReplayExecutor


def test_defaults_are_local_servers_over_a_stream():
    settings = ConnectionSettings()
    assert settings.servers is None and settings.transport == "stream" and settings.max_attempts == 3
    assert settings.hold_seconds == HOLD_RESPONSES_SECONDS and not settings.tls
    assert settings.local_server_gpus() is None and settings.local_server_args() == []


def test_lists_become_tuples_and_a_test_engine_runs_on_gpu_0():
    settings = ConnectionSettings(servers=["a:1", "b:2"], local_gpus=[1], server_args=["--workers", "2"])
    assert settings.servers == ("a:1", "b:2") and settings.local_gpus == (1,) and settings.server_args == ("--workers", "2")
    engine = ConnectionSettings(engine="pkg.mod:factory", server_args=["-v"])
    assert engine.local_server_gpus() == [0] and engine.local_server_args() == ["--engine", "pkg.mod:factory", "-v"]
    assert engine.with_(local_gpus=[2, 3]).local_server_gpus() == [2, 3]


@pytest.mark.parametrize("fields, message", [
    ({"servers": []}, "servers is empty"),
    ({"servers": "a:1"}, "give a list of 'host:port'"),
    ({"token": "t", "token_file": "f"}, "token or token_file, not both"),
    ({"tls_cert": "c.pem"}, "tls_cert and tls_key go together"),
    ({"max_attempts": 0}, "max_attempts=0"),
    ({"retry_window": -1}, "retry_window=-1"),
    ({"transport": "carrier pigeon"}, "use one of stream, unary"),
    ({"hold_responses": 2}, "hold_responses=2: give 0..1"),
    ({"local_gpus": [0, -1]}, "GPU indices"),
    ({"server_args": "--workers 2"}, "mneme serve arguments"),
    ({"server_env": ["A=1"]}, "mapping of variable names"),
    ({"startup_timeout": 0}, "startup_timeout=0"),
    ({"keep_alive": -5}, "keep_alive=-5"),
])
def test_bad_settings_are_refused_when_made(fields, message):
    with pytest.raises(ConfigurationError, match=message):
        ConnectionSettings(**fields)


def test_the_references_servers_argument_fills_the_connection():
    with pytest.raises(ConfigurationError, match="name different servers"):
        AsyncReplayExecutor("db.json", "1", 3, None, 1, ["127.0.0.1:1"],
                            connection=ConnectionSettings(servers=["127.0.0.1:2"]))
    with pytest.raises(ConfigurationError, match="TLS settings apply to remote servers"):
        AsyncReplayExecutor("db.json", "1", connection=ConnectionSettings(tls_ca="ca.pem"))
    with pytest.raises(ConfigurationError, match="give a ConnectionSettings"):
        AsyncReplayExecutor("db.json", "1", servers=["127.0.0.1:1"], connection={"transport": "unary"})
