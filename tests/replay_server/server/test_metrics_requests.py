"""Hardware counters through the replay servers: ReplayRequest.metrics reaches the worker's engine and
Result.metrics (or metrics_error) comes back; the test engine answers in worker processes."""

from __future__ import annotations

import grpc
import pytest

from mneme.model.experiment import ExperimentConfiguration
from replay_server.client.connection import ConnectionSettings
from replay_server.client.executor import AsyncReplayExecutor
from replay_server.protocol import replay_pb2
from replay_server.protocol.convert import result_from_proto
from replay_server.server.engine import InstanceKey
from replay_server.server.jobs import Job, JobQueue
from replay_server.server.worker import _run
from replay_server.testing.fake_engine import NO_COUNTERS_ERROR, fake_metric_value
from replay_server.testing.servers import (  # noqa: F401
    RECORD_DB,
    RECORD_ID,
    make_server,
    request,
    start_server,
    store,
    stub_for,
)


@pytest.fixture
def stub(store, tmp_path):
    server = make_server(store, tmp_path / "log")
    yield stub_for(server.start())
    server.stop()


def _config(block_x=64):
    return ExperimentConfiguration.from_dict({"block": {"x": block_x}})


def test_the_request_names_the_counters_and_the_result_carries_them(stub):
    ask = request(block_x=128)
    ask.metrics.extend(["dram_bytes", "lts__t_sectors.sum"])
    result = result_from_proto(stub.Replay(ask, timeout=30).result)
    assert result.verified and result.metrics_error == ""
    assert result.metrics == {name: fake_metric_value(name, _config(128)) for name in ("dram_bytes", "lts__t_sectors.sum")}
    plain = result_from_proto(stub.Replay(request(), timeout=30).result)
    assert plain.metrics == {} and plain.metrics_error == ""


def test_a_host_that_cannot_profile_answers_in_the_result(stub):
    ask = request(record_id="no-counters")
    ask.metrics.append("dram_bytes")
    result = result_from_proto(stub.Replay(ask, timeout=30).result)
    assert result.verified and result.metrics == {} and result.metrics_error == NO_COUNTERS_ERROR


def test_a_name_that_is_no_metric_is_an_invalid_argument(stub):
    ask = request()
    ask.metrics.append("dram_byte")
    with pytest.raises(grpc.RpcError) as caught:
        stub.Replay(ask, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "dram_byte: not a metric mneme knows; close names: dram_bytes" in caught.value.details()


def test_the_server_says_it_collects_counters(stub):
    assert "metrics" in stub.GetServerInfo(replay_pb2.ServerInfoRequest()).capabilities


def test_an_engine_that_does_not_profile_says_so():
    class OldEngine:
        def run(self, config, iterations, warmup, compiled=None):
            from mneme.model.experiment import ExperimentResult

            return ExperimentResult(verified=True, status="verified", exec_time=[1] * (iterations + warmup))

    result = _run(OldEngine(), _config(), 1, 0, None, ("dram_bytes",))
    assert result.verified and result.metrics_error == (
        "hardware counters cannot be collected: this server's engine does not profile")
    assert _run(OldEngine(), _config(), 1, 0, None).metrics_error == ""


def test_a_job_with_counters_is_sent_alone():
    """A job that collects hardware counters is profiled after its own timed launches: never in a worker
    message with other jobs (one engine call), neither as the first of a group nor taken into one."""
    instance = InstanceKey("/store", RECORD_DB, RECORD_ID)
    queue = JobQueue()
    jobs = [Job("run", instance, _config(32 * (i + 1)), metrics=("dram_bytes",) if i in (0, 2) else ())
            for i in range(5)]
    for job in jobs:
        queue.put(job)
    taken = [queue.get_many(0.0, None, 8) for _ in range(3)]
    assert taken == [[jobs[0]], [jobs[1], jobs[3], jobs[4]], [jobs[2]]]


def test_the_executor_sends_the_counters_with_every_request(store, tmp_path):
    server, address = start_server(store, tmp_path / "log")
    try:
        executor = AsyncReplayExecutor(str(store / RECORD_DB), RECORD_ID, servers=[address],
                                       metrics=["dram_bytes,achieved_occupancy"],
                                       connection=ConnectionSettings(transport="unary"))
        with executor:
            assert executor.metrics == ("dram_bytes", "achieved_occupancy")
            results = [executor.submit(_config(x)).result(timeout=30) for x in (32, 64)]
        for x, result in zip((32, 64), results):
            assert result.metrics == {n: fake_metric_value(n, _config(x)) for n in ("dram_bytes", "achieved_occupancy")}
        streamed = AsyncReplayExecutor(str(store / RECORD_DB), RECORD_ID, servers=[address], metrics=["ipc"])
        with streamed:
            assert streamed.evaluate(_config(32)).metrics == {"ipc": fake_metric_value("ipc", _config(32))}
    finally:
        server.terminate()  # a clean stop: its workers go too
        server.wait(timeout=60)
