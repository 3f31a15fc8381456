"""Local servers: GPU 0's starts before the GPUs are counted; workers are spread over the GPUs counted."""

from __future__ import annotations

import pytest
from server_helpers import ENGINE_ARGS, store, subprocess_env  # noqa: F401

import mneme.local_servers
from mneme.errors import NotAvailableError
from mneme.local_servers import LocalServers


def _workers(server) -> str:
    args = list(server.process.args)
    return args[args.index("--workers") + 1]


@pytest.mark.parametrize("gpus, expected", [(1, [(0, "3")]), (2, [(0, "2"), (1, "1")])])
def test_workers_spread_over_the_counted_gpus(store, tmp_path, monkeypatch, gpus, expected):
    monkeypatch.setattr(mneme.local_servers, "local_gpu_count", lambda: gpus)
    servers = LocalServers.start(str(store), 3, server_args=ENGINE_ARGS, server_env=subprocess_env(tmp_path / "log"))
    try:
        assert [(s.gpu, _workers(s)) for s in servers.servers] == expected
        assert len(set(servers.addresses(60))) == gpus
    finally:
        servers.stop()
    assert all(s.process.poll() is not None for s in servers.servers)


def test_no_gpu_stops_the_server_started_ahead(store, tmp_path, monkeypatch):
    monkeypatch.setattr(mneme.local_servers, "local_gpu_count", lambda: 0)
    spawned = []
    real_start = mneme.local_servers.LocalServer.start

    def start(*args, **kwargs):
        spawned.append(real_start(*args, **kwargs))
        return spawned[-1]

    monkeypatch.setattr(mneme.local_servers.LocalServer, "start", start)
    with pytest.raises(NotAvailableError, match="servers="):
        LocalServers.start(str(store), 1, server_args=ENGINE_ARGS, server_env=subprocess_env(tmp_path / "log"))
    assert len(spawned) == 1 and spawned[0].process.poll() is not None
