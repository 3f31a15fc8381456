"""Local servers: GPU 0's starts before the GPUs are counted; workers are spread over the GPUs counted."""

from __future__ import annotations

import pytest

import replay_server.client.local_servers
from mneme.errors import NotAvailableError
from replay_server.client.local_servers import LocalServers
from replay_server.testing.servers import ENGINE_ARGS, store, subprocess_env  # noqa: F401


def _workers(server) -> str:
    args = list(server.process.args)
    return args[args.index("--workers") + 1]


@pytest.mark.parametrize("gpus, expected", [(1, [(0, "3")]), (2, [(0, "2"), (1, "1")])])
def test_workers_spread_over_the_counted_gpus(store, tmp_path, monkeypatch, gpus, expected):
    monkeypatch.setattr(replay_server.client.local_servers, "local_gpu_count", lambda: gpus)
    servers = LocalServers.start(str(store), 3, server_args=ENGINE_ARGS, server_env=subprocess_env(tmp_path / "log"))
    try:
        assert [(s.gpu, _workers(s)) for s in servers.servers] == expected
        assert len(set(servers.addresses(60))) == gpus
    finally:
        servers.stop()
    assert all(s.process.poll() is not None for s in servers.servers)


def test_no_gpu_stops_the_server_started_ahead(store, tmp_path, monkeypatch):
    monkeypatch.setattr(replay_server.client.local_servers, "local_gpu_count", lambda: 0)
    spawned = []
    real_start = replay_server.client.local_servers.LocalServer.start

    def start(*args, **kwargs):
        spawned.append(real_start(*args, **kwargs))
        return spawned[-1]

    monkeypatch.setattr(replay_server.client.local_servers.LocalServer, "start", start)
    with pytest.raises(NotAvailableError, match="servers="):
        LocalServers.start(str(store), 1, server_args=ENGINE_ARGS, server_env=subprocess_env(tmp_path / "log"))
    assert len(spawned) == 1 and spawned[0].process.poll() is not None


@pytest.mark.parametrize("wait_on_stop", [True, False])
def test_servers_never_stopped_are_stopped_at_exit_without_waiting_unless_asked(monkeypatch, wait_on_stop):
    """`mneme tune` (wait_on_stop=False) exits without waiting for its servers' teardown, also when the
    servers are stopped by the object's finalizer at interpreter exit rather than by stop()."""
    import gc

    calls = []
    monkeypatch.setattr(replay_server.client.local_servers, "_stop_all", lambda servers, wait=True: calls.append(wait))
    servers = LocalServers(wait_on_stop=wait_on_stop)
    del servers
    gc.collect()
    assert calls == [wait_on_stop]
