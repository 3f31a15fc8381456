"""mneme tune starts its local servers early; a failure to start them surfaces where the executor is made."""

from __future__ import annotations

import pytest

import replay_server.client.local_servers
from mneme.errors import NotAvailableError
from tuner.options import TuneOptions
from tuner.run import PrestartedServers


def test_no_gpu_is_reported_when_the_servers_are_taken(monkeypatch, tmp_path):
    monkeypatch.setattr(replay_server.client.local_servers, "local_gpu_count", lambda: 0)
    early = PrestartedServers(TuneOptions(record_database=str(tmp_path / "1.json"), workers=1))
    with pytest.raises(NotAvailableError, match="no GPU is visible"):
        early.take()
    early.discard()  # nothing was started: nothing to stop

