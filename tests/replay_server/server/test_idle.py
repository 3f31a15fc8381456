"""A kept server's idle decision (replay_server.server.idle): atomic with the calls it lets in."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from replay_server.protocol import replay_pb2
from replay_server.server.idle import Activity
from replay_server.testing.servers import make_server, store, stub_for, wait_for  # noqa: F401 (fixture)


def test_a_call_in_progress_keeps_the_server_and_once_closed_calls_are_refused():
    activity = Activity()
    assert activity.begin()
    assert not activity.close_if_idle(0.0)  # a call is in progress
    activity.end()
    assert not activity.close_if_idle(60.0)  # it ended just now
    assert activity.close_if_idle(0.0)
    assert not activity.begin()  # for good: the server is stopping


def test_the_decision_and_the_calls_it_lets_in_are_atomic():
    """Threads that begin calls while the server decides: every call counted before the close kept it
    (the close failed then), and none is counted after it."""
    activity = Activity()
    counted, refused = [], []
    started = threading.Barrier(5)

    def caller():
        started.wait()
        for _ in range(2000):
            if activity.begin():
                counted.append(time.monotonic())
                activity.end()
            else:
                refused.append(time.monotonic())
                return

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    started.wait()
    closed_at = None
    while closed_at is None:
        if activity.close_if_idle(0.0):
            closed_at = time.monotonic()
    for t in threads:
        t.join()
    assert all(c <= closed_at for c in counted)
    assert not activity.begin()


def test_a_kept_server_that_decided_to_stop_refuses_calls_with_a_reason(store, tmp_path):  # noqa: F811
    server = make_server(store, tmp_path / "log", keep_alive=60.0)
    port = server.start()
    try:
        stub = stub_for(port)
        stub.GetServerInfo(replay_pb2.ServerInfoRequest(), timeout=10)  # counted: the server is in use
        assert not server.activity.close_if_idle(60.0)
        # The call's end is counted just after its answer leaves the server: closing succeeds once it is.
        wait_for(lambda: server.activity.close_if_idle(0.0), "the server closes once no call is in progress")
        with pytest.raises(grpc.RpcError) as refused:
            stub.GetServerInfo(replay_pb2.ServerInfoRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "stopping" in refused.value.details()
    finally:
        server.stop()
