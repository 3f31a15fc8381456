"""Workers prove themselves before taking work; a GPU that never passes makes the server NOT_SERVING."""

from __future__ import annotations

import grpc
import pytest

from replay_server.protocol import health_pb2, health_pb2_grpc, replay_pb2
from replay_server.protocol.convert import result_from_proto
from replay_server.testing.servers import make_server, request, store, stub_for  # noqa: F401


def test_a_failed_self_test_is_retried(store, tmp_path):
    server = make_server(store, tmp_path / "log", fail_starts=1)
    port = server.start()
    try:
        assert result_from_proto(stub_for(port).Replay(request(), timeout=20).result).verified
        assert (tmp_path / "log" / "starts").read_text() == "2"
    finally:
        server.stop()


def test_repeated_start_failures_mark_the_server_not_serving(store, tmp_path):
    server = make_server(store, tmp_path / "log", fail_starts=100, max_start_failures=2)
    port = server.start()
    try:
        stub = stub_for(port)
        queued = stub.Replay.future(request(), timeout=20)
        with pytest.raises(grpc.RpcError) as err:
            queued.result()
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "self-test failed" in err.value.details() and "simulated" in err.value.details()
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()
        status = health.Check(health_pb2.HealthCheckRequest(service="mneme.v1.ReplayService")).status
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.RpcError) as err:  # new work is refused at once, not queued forever
            stub.Replay(request(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert int((tmp_path / "log" / "starts").read_text()) == 2
        assert stub.GetServerInfo(replay_pb2.ServerInfoRequest()).workers_ready == 0
    finally:
        server.stop()


def test_the_cuda_engine_without_a_gpu_says_why(store, tmp_path):
    from replay_server.server.cuda_engine import CudaEngineSpec

    try:
        CudaEngineSpec().self_test(0)
    except Exception as exc:
        reason = str(exc)
    else:
        pytest.skip("a GPU is usable here: the start-up failure path is not reachable")
    server = make_server(store, tmp_path / "log", engine=CudaEngineSpec(), max_start_failures=1)
    port = server.start()
    try:
        with pytest.raises(grpc.RpcError) as err:
            stub_for(port).Replay(request(), timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "self-test failed" in err.value.details() and reason[:40] in err.value.details()
    finally:
        server.stop()
