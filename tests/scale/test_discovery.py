"""Discovery: `mneme serve --announce` and `--servers-from`, in a directory and in S3 (moto server)."""

from __future__ import annotations

import json
import signal

import pytest
from scale_helpers import wait_until

from mneme import __version__
from mneme.errors import NotAvailableError
from mneme.model.experiment import ExperimentConfiguration
from mneme.testing.moto_s3 import make_bucket, s3_environment, start_moto_server, stop
from replay_server.client.executor import AsyncReplayExecutor
from replay_server.discovery import (
    follow,
    live_servers,
    read_announcements,
    wait_for_servers,
)
from replay_server.testing.servers import RECORD_DB, RECORD_ID, start_server, store  # noqa: F401

LEASE = "1.5"


def announce(store_dir, log_dir, location):
    return start_server(store_dir, log_dir, "--announce", str(location), "--lease", LEASE, "--workers", "2",
                        replay_seconds=0.005)


def check_announce_and_expire(store_dir, tmp_path, location):
    a, a_address = announce(store_dir, tmp_path / "log-a", location)
    b, b_address = announce(store_dir, tmp_path / "log-b", location)
    try:
        assert wait_until(lambda: live_servers(location) == sorted([a_address, b_address]))
        found = {x.address: x for x in read_announcements(location)}
        assert found[a_address].version == __version__ and found[a_address].gpu == 0
        assert found[a_address].health == "SERVING" and found[a_address].engine == "fake"
        assert found[a_address].pid == a.pid and found[a_address].lease_s == float(LEASE)
        first = found[a_address].refreshed
        assert wait_until(lambda: {x.address: x for x in read_announcements(location)}[a_address].refreshed > first)
        a.send_signal(signal.SIGKILL)  # no goodbye: its lease runs out
        a.wait()
        assert a_address in live_servers(location)
        assert wait_until(lambda: live_servers(location) == [b_address], timeout=10)
        assert a_address in [x.address for x in read_announcements(location)], "expired, not deleted"
        b.send_signal(signal.SIGTERM)  # a clean stop deletes its announcement
        b.wait(timeout=30)
        assert b_address not in [x.address for x in read_announcements(location)]
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_servers_announce_themselves_in_a_directory_and_expire(store, tmp_path):
    check_announce_and_expire(store, tmp_path, tmp_path / "servers")


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    proc, endpoint = start_moto_server(tmp_path_factory.mktemp("moto"))
    yield endpoint
    stop(proc)


def test_servers_announce_themselves_in_s3(store, tmp_path, moto, monkeypatch):
    for key in ("MNEME_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    for key, value in s3_environment(moto).items():
        monkeypatch.setenv(key, value)  # the servers (children) inherit it
    make_bucket(moto, "announce")
    check_announce_and_expire(store, tmp_path, "s3://announce/cluster/servers")


def test_the_executor_takes_joiners_and_drops_expired_servers(store, tmp_path):
    location = tmp_path / "servers"
    a, a_address = announce(store, tmp_path / "log-a", location)
    b = None
    try:
        servers = wait_for_servers(str(location), timeout=20)
        assert servers == [a_address]
        with AsyncReplayExecutor(str(store / RECORD_DB), RECORD_ID, iterations=1, warmup=0, servers=servers,
                                 results_db_dir=str(tmp_path / "results")) as executor:
            watcher = follow(executor, str(location), interval=0.2)

            def run(n):
                futures = [executor.submit(ExperimentConfiguration.from_dict({"block": {"x": 32 + i % 64}}))
                           for i in range(n)]
                return [f.result(timeout=60) for f in futures]

            assert all(r.verified for r in run(20))
            b, b_address = announce(store, tmp_path / "log-b", location)
            assert wait_until(lambda: b_address in executor.servers)
            a.send_signal(signal.SIGKILL)
            a.wait()
            assert wait_until(lambda: executor.servers == [b_address], timeout=10)
            assert all(r.verified for r in run(40))
        assert watcher._stop.is_set(), "the watcher stops with the executor"
        lines = [json.loads(line) for line in (tmp_path / "results" / "results.jsonl").read_text().splitlines()]
        assert len(lines) == 60
        assert {line["server"] for line in lines[20:]} == {b_address}, "after its lease ran out, a got no work"
        assert b_address in {line["server"] for line in lines}
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_no_announced_server_says_what_to_start(tmp_path):
    with pytest.raises(NotAvailableError, match="mneme serve --gpu N --announce"):
        wait_for_servers(str(tmp_path / "nobody"), timeout=0.2)


def test_an_announcement_is_live_only_while_fresh_and_serving():
    from replay_server.discovery import Announcement

    fresh = Announcement(address="h:1", gpu=0, lease_s=10, refreshed=100.0)
    assert fresh.live(now=105.0) and not fresh.live(now=110.5)
    assert not Announcement(address="h:1", gpu=0, lease_s=10, refreshed=100.0, health="NOT_SERVING").live(now=101)
    assert fresh.name == "server-h_1-gpu0.json"
