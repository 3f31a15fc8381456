"""Kernels that are not idempotent on a server: a proof that loses its worker's context decides resets before
every launch, and a fresh worker replays with them; a hanging configuration costs a watchdog derived from the
kernel's time, not the server's whole one."""

from __future__ import annotations

import time

import pytest

import replay_server.server.worker_pool as worker_pool
from replay_server.protocol import replay_pb2
from replay_server.protocol.convert import result_from_proto
from replay_server.testing.servers import make_server, request, runs, store, stub_for  # noqa: F401

REASON = "the kernel is not idempotent: a second launch without a reset did not finish (simulated)"


@pytest.fixture
def serve(store, tmp_path):  # noqa: F811
    started = []

    def start(**options):
        server = make_server(store, tmp_path / "log", **options)
        started.append(server)
        return server, stub_for(server.start())

    yield start
    for server in started:
        server.stop()


def test_a_prepare_whose_proof_loses_the_worker_succeeds_and_every_launch_is_reset(serve, tmp_path):
    server, stub = serve(workers=1)
    instance = request(record_id="proof-hang").instance
    prepared = stub.Prepare(replay_pb2.PrepareRequest(instance=instance), timeout=30)
    assert prepared.workers_prepared == 1
    assert server.pool.restarts == 1  # the worker whose proof lost its context was replaced
    result = result_from_proto(stub.Replay(request(record_id="proof-hang"), timeout=30).result)
    assert result.verified and result.reset_each_launch and result.reset_reason == REASON
    assert server.pool.restarts == 1  # the fresh worker replays with the decision: no proof, no loss


def test_a_first_replay_whose_proof_loses_the_worker_is_done_again_by_a_fresh_one(serve, tmp_path):
    server, stub = serve(workers=2)
    answers = [result_from_proto(stub.Replay(request(record_id="proof-hang", block_x=64 * (i + 1)), timeout=30).result)
               for i in range(4)]
    assert all(a.verified and a.reset_each_launch and a.reset_reason == REASON for a in answers), answers
    assert server.pool.restarts >= 1
    assert len(runs(tmp_path / "log")) == 4  # each configuration replayed once, by a worker with the decision


def test_a_hanging_configuration_costs_the_derived_watchdog_not_the_servers(serve, monkeypatch):
    monkeypatch.setattr(worker_pool, "MIN_WATCHDOG_S", 0.5)
    monkeypatch.setattr(worker_pool, "WATCHDOG_SLACK_S", 0.2)
    server, stub = serve(workers=1, watchdog=60.0)
    stub.Prepare(replay_pb2.PrepareRequest(instance=request().instance), timeout=30)  # learns the kernel's time
    started = time.monotonic()
    hung = result_from_proto(stub.Replay(request("hang"), timeout=60).result)
    took = time.monotonic() - started
    assert hung.status == "timeout" and took < 15, (took, hung.error)
    assert "no result within 0.5s (watchdog (20x the kernel's 1 us x 5 launches + 0.2s))" in hung.error
    assert result_from_proto(stub.Replay(request(), timeout=30).result).verified  # a fresh worker serves


def test_a_request_that_names_its_timeout_keeps_it(serve, monkeypatch):
    monkeypatch.setattr(worker_pool, "MIN_WATCHDOG_S", 0.5)
    monkeypatch.setattr(worker_pool, "WATCHDOG_SLACK_S", 0.2)
    server, stub = serve(workers=1, watchdog=60.0)
    stub.Prepare(replay_pb2.PrepareRequest(instance=request().instance), timeout=30)
    slow = request("slow:1.0")
    slow.timeout_seconds = 10
    assert result_from_proto(stub.Replay(slow, timeout=30).result).verified  # 10 s asked for: not cut at 0.5 s
