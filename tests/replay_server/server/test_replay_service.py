"""The replay server over real gRPC, with real worker processes running the test engine."""

from __future__ import annotations

import time
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from replay_server.protocol import health_pb2, health_pb2_grpc, replay_pb2
from replay_server.protocol.convert import result_from_proto
from replay_server.testing.fake_engine import TAKEN_REASON
from replay_server.testing.servers import (  # noqa: F401
    RECORD_DB,
    RECORD_ID,
    free_port,
    make_server,
    request,
    runs,
    store,
    stub_for,
    wait_for,
)


@pytest.fixture
def serve(store, tmp_path):
    """serve(**options) -> (server, stub): a started server with the test engine logging to tmp_path/log,
    stopped after the test."""
    started = []

    def start(**options):
        server = make_server(store, tmp_path / "log", **options)
        started.append(server)
        return server, stub_for(server.start())

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def served(serve, tmp_path):
    """A server with two workers and metrics on HTTP."""
    metrics_port = free_port()
    server, stub = serve(workers=2, metrics_port=metrics_port)
    return stub, server, tmp_path / "log", metrics_port


def _metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


def test_faults_and_hangs_fail_only_their_configuration(served):
    stub, server, log, metrics_port = served
    outcomes = {}
    for passes in ["default<O3>", "crash", "default<O2>", "hang", "fault", "raise", "default<O1>"]:
        outcomes[passes] = result_from_proto(stub.Replay(request(passes), timeout=30).result)
    for good in ["default<O3>", "default<O2>", "default<O1>"]:
        assert outcomes[good].verified and outcomes[good].exec_time == [64] * 5
    assert outcomes["crash"].failed and outcomes["crash"].status == "runtime_error"
    assert "SIGSEGV" in outcomes["crash"].error and "replaced" in outcomes["crash"].error
    assert outcomes["hang"].failed and outcomes["hang"].status == "timeout" and "watchdog" in outcomes["hang"].error
    assert outcomes["fault"].failed and "ILLEGAL_ADDRESS" in outcomes["fault"].error
    assert outcomes["raise"].status == "internal_error" and "simulated engine bug" in outcomes["raise"].error
    info = stub.GetServerInfo(replay_pb2.ServerInfoRequest())
    assert info.worker_restarts == 3 and info.replays_completed == 7 and info.engine == "fake"
    assert (info.gpu_name, info.arch) == ("fake GPU", "sm_test")
    wait_for(lambda: stub.GetServerInfo(replay_pb2.ServerInfoRequest()).workers_ready == 2,
             "replaced workers pass their self-test and come back")

    m = _metrics(metrics_port)
    assert m["mneme_replays_total{outcome=verified}"] == 3
    assert m["mneme_replays_total{outcome=timeout}"] == 1
    assert m["mneme_replays_total{outcome=failed}"] == 3
    assert m["mneme_worker_restarts_total"] == 3
    assert m["mneme_replay_latency_seconds_count"] == 7
    assert m["mneme_kernel_time_seconds_count"] == 3
    assert m["mneme_compile_cache_misses_total"] >= 1
    assert m["mneme_build_info{engine=fake,gpu=0,version=0.1.0}"] == 1
    assert m["mneme_workers_ready"] == 2 and m["mneme_queue_depth"] == 0


def test_stream_answers_every_request_and_keeps_order_free(served):
    stub, server, log, _ = served
    requests = [request("default<O3>", 32 * i, request_id=f"id{i}") for i in range(1, 11)]
    requests.insert(3, request("crash", request_id="bad"))
    requests.insert(6, request(request_id="traversal", record_db="../outside.json"))
    requests.insert(8, request(request_id="invalid", block_x=4096))
    responses = {r.request_id: result_from_proto(r.result) for r in stub.ReplayStream(iter(requests), timeout=30)}
    assert set(responses) == {r.request_id for r in requests}
    for i in range(1, 11):  # each result is attached to its own configuration
        assert responses[f"id{i}"].verified and responses[f"id{i}"].exec_time[0] == 32 * i
    assert responses["bad"].failed and "SIGSEGV" in responses["bad"].error
    assert responses["traversal"].failed and "INVALID_ARGUMENT" in responses["traversal"].error
    assert responses["invalid"].status == "invalid_config" and "1024" in responses["invalid"].error


def test_compile_cache_serves_repeated_code(served):
    stub, server, log, metrics_port = served
    first = result_from_proto(stub.Replay(request("default<O2>", 64), timeout=30).result)
    again = result_from_proto(stub.Replay(request("default<O2>", 128), timeout=30).result)  # same code, new shape
    assert first.obj_size == len(b"code:default<O2>:sm_test") and not first.compile_cached
    assert again.compile_cached
    m = _metrics(metrics_port)
    assert m["mneme_compile_cache_hits_total"] >= 1 and m["mneme_compile_seconds_count"] >= 1


def test_a_crashed_compile_pool_is_replaced(served):
    stub = served[0]
    crashed = result_from_proto(stub.Replay(request("compile-crash"), timeout=30).result)
    assert crashed.verified and crashed.obj_size == -1  # the worker went on without precompiled code
    after = result_from_proto(stub.Replay(request("default<O1>"), timeout=30).result)
    assert after.obj_size == len(b"code:default<O1>:sm_test")


@pytest.mark.parametrize("mutate, fragment", [
    (lambda r: r.ClearField("instance"), "names no instance"),
    (lambda r: r.ClearField("config"), "no configuration"),
    (lambda r: setattr(r, "iterations", 0), "iterations"),
    (lambda r: setattr(r.instance, "record_db", "../outside.json"), "not a valid store key"),
    (lambda r: setattr(r.instance, "record_db", "/etc/passwd"), "relative"),
    (lambda r: setattr(r.instance, "record_id", "../../x"), "record_id"),
    (lambda r: setattr(r.config, "codegen_method", 7), None),
    (lambda r: setattr(r.instance.verification, "runs", 1), "at least 2 runs"),
    (lambda r: setattr(r.instance.verification, "overrides", '{"acc": "f32:sometimes:1"}'), "sometimes"),
    (lambda r: setattr(r.instance.verification, "overrides", "not json"), "JSON object"),
    (lambda r: r.instance.MergeFromString(b"\x1a\x04auto"), "sets tolerance, which this server no longer reads"),
])
def test_malformed_requests_are_invalid_argument(served, mutate, fragment):
    stub = served[0]
    req = request()
    try:
        mutate(req)
    except TypeError:  # protobuf itself refuses the value: nothing to send
        return
    with pytest.raises(grpc.RpcError) as err:
        stub.Replay(req, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in err.value.details()


def test_unknown_objects_are_not_found(served):
    stub = served[0]
    with pytest.raises(grpc.RpcError) as err:
        stub.Replay(request(record_db="999.json"), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "999.json" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stub.Replay(request(record_id="missing"), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "missing" in err.value.details()
    assert result_from_proto(stub.Replay(request(), timeout=10).result).verified  # and it keeps serving


def test_relocation_is_reported_on_the_wire_and_no_relocate_refuses(served):
    stub = served[0]
    result = result_from_proto(stub.Replay(request(record_id="taken-addresses"), timeout=20).result)
    assert result.verified and result.relocated and result.relocation_reason == TAKEN_REASON
    refused = request(record_id="taken-addresses")
    refused.instance.verification.relocate = False
    with pytest.raises(grpc.RpcError) as err:
        stub.Replay(refused, timeout=20)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and TAKEN_REASON in err.value.details()
    assert not result_from_proto(stub.Replay(request(), timeout=20).result).relocated  # and it keeps serving


def test_prepare_restores_on_every_worker(served):
    stub = served[0]
    response = stub.Prepare(replay_pb2.PrepareRequest(instance=request().instance), timeout=20)
    assert response.workers_prepared == 2 and response.device_bytes == 1 << 20
    assert stub.GetServerInfo(replay_pb2.ServerInfoRequest()).prepared_instance_bytes == 2 << 20
    # Each worker did the instance's one-time device work then, not in a first configuration.
    ready = (served[2] / "ready.log").read_text().split("\n")[:-1]
    assert sorted(line.split()[0] for line in ready) == [request().instance.record_id] * 2
    assert len({line.split()[1] for line in ready}) == 2


def test_prepare_that_cannot_get_ready_fails_clearly_and_the_server_goes_on(served):
    stub, server, log, _ = served
    instance = request(record_id="ready-fault").instance
    with pytest.raises(grpc.RpcError) as err:
        stub.Prepare(replay_pb2.PrepareRequest(instance=instance), timeout=20)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "cannot replay it: the recorded baseline faulted (simulated)" in err.value.details()
    assert "the worker was replaced" in err.value.details()
    assert result_from_proto(stub.Replay(request(), timeout=20).result).verified  # fresh workers serve


def test_prepare_that_hangs_is_stopped_by_the_watchdog(served):
    stub, server, log, _ = served
    instance = request(record_id="ready-hang").instance
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        stub.Prepare(replay_pb2.PrepareRequest(instance=instance), timeout=30)
    assert time.monotonic() - started < 15  # the 1 s watchdog, then the worker's replacement
    assert "watchdog" in err.value.details()
    assert result_from_proto(stub.Replay(request(), timeout=20).result).verified


def test_health_reports_serving(served):
    server = served[1]
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{server.port}"))
    for service in ("", "mneme.v1.ReplayService"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service)).status == \
            health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as err:
        health.Check(health_pb2.HealthCheckRequest(service="nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_queued_work_waits_and_a_cancelled_call_never_runs(serve, tmp_path):
    server, stub = serve(workers=1, depth=1)
    busy = stub.Replay.future(request("slow:0.6", 1), timeout=30)
    wait_for(lambda: runs(tmp_path / "log"), "the slow configuration started on the only worker")
    queued = stub.Replay.future(request("default<O3>", 2), timeout=30)
    doomed = stub.Replay.future(request("default<O3>", 3), timeout=30)
    wait_for(lambda: stub.GetServerInfo(replay_pb2.ServerInfoRequest()).queue_depth == 2,
             "two configurations queued behind it", seconds=0.5)
    doomed.cancel()
    assert result_from_proto(busy.result().result).verified
    assert result_from_proto(queued.result().result).exec_time[0] == 2
    time.sleep(0.2)
    ran = [line.split()[1] for line in runs(tmp_path / "log")]
    assert ran == ["1", "2"], "the cancelled configuration must not run"
    assert server.metrics.cancelled._value.get() == 1


def test_innocent_work_queued_behind_a_crash_is_not_lost(serve, tmp_path):
    _, stub = serve(workers=1, depth=3)
    crash = stub.Replay.future(request("crash"), timeout=30)
    after = [stub.Replay.future(request("default<O3>", 10 + i), timeout=30) for i in range(4)]
    assert result_from_proto(crash.result().result).status == "runtime_error"
    results = [result_from_proto(f.result().result) for f in after]
    assert [r.exec_time[0] for r in results] == [10, 11, 12, 13] and all(r.verified for r in results)


def test_a_cancelled_stream_takes_its_queued_work_with_it(serve, tmp_path):
    server, stub = serve(workers=1, depth=1, batch=1)  # one job in the worker's hands: the rest stay queued
    # All of the same code, so that they are ready together and run in their order (the recorded code's
    # would need no compile and go ahead of the first while its compile process starts).
    call = stub.ReplayStream(iter([request("slow:0.5", 1, "a")] + [request("slow:0.5", i, str(i)) for i in (2, 3, 4)]))
    wait_for(lambda: runs(tmp_path / "log"), "the slow configuration started")
    call.cancel()
    time.sleep(0.8)
    assert [line.split()[1] for line in runs(tmp_path / "log")] == ["1"]
    assert server.metrics.cancelled._value.get() == 3 and len(server.pool.queue) == 0
    assert result_from_proto(stub.Replay(request(), timeout=10).result).verified  # the worker is free again


def _messages(stub, requests, hold: float) -> list[tuple[float, list[str]]]:
    """One ReplayBatchStream call sending ``requests`` in one message with ``hold_responses_seconds=hold``:
    per response message, when it came (seconds after the call) and the request ids it answered."""
    start = time.monotonic()
    batch = replay_pb2.ReplayBatch(requests=requests, hold_responses_seconds=hold)
    return [(time.monotonic() - start, [r.request_id for r in message.responses])
            for message in stub.ReplayBatchStream(iter([batch]), timeout=60)]


def test_a_batch_stream_holds_responses_while_its_requests_wait_in_the_queue(serve):
    _, stub = serve(workers=1, depth=2, batch=1)  # (several per engine call would be ready together anyway)
    requests = [request("slow:0.02", 64, f"held{i}") for i in range(12)]
    held = _messages(stub, requests, hold=5.0)
    assert sorted(i for _, ids in held for i in ids) == sorted(r.request_id for r in requests)
    # Held while some waited in the queue (the worker has two in hand): the first ten or so in one message,
    # sent when the queue ran dry (well before the 5 s hold), the last ones as they came.
    assert len(held[0][1]) >= 8 and len(held) <= 4 and held[-1][0] < 4.0, held
    at_once = _messages(stub, [request("slow:0.02", 64, f"now{i}") for i in range(12)], hold=0.0)
    assert len(at_once) >= 6, at_once  # no hold (a client that predates the field): each as it is ready


def test_a_lone_request_is_answered_at_once_whatever_the_hold(serve):
    _, stub = serve(workers=2)
    ((when, ids),) = _messages(stub, [request("slow:0.05", 64, "only")], hold=5.0)
    assert ids == ["only"] and when < 3.0  # nothing of its call waits in the queue: nothing to hold it for


def test_prepare_compiles_the_listed_code_ahead_and_says_what_it_could_not(serve, tmp_path):
    _, stub = serve(workers=1, compile_processes=2)
    listed = [request(passes, block_x).config for passes, block_x in
              (("default<O1>", 64), ("default<O2>", 64), ("default<O2>", 256), ("compile-error", 64))]
    listed.append(replay_pb2.Configuration(block=replay_pb2.Dim3(x=4096, y=1, z=1), passes="default<O1>"))
    prepared = stub.Prepare(replay_pb2.PrepareRequest(instance=request().instance, compile=listed), timeout=30)
    errors = list(prepared.compile_errors)
    assert errors[:3] == ["", "", ""] and prepared.workers_prepared == 1
    assert errors[3].startswith("compile failed:") and "simulated compiler error" in errors[3]
    assert errors[4].startswith("invalid configuration:") and "4096" in errors[4]
    compiled = [line.split()[0] for line in (tmp_path / "log" / "compiles.log").read_text().splitlines()]
    assert sorted(c for c in compiled if c != "default<O3>") == ["compile-error", "default<O1>", "default<O2>"]
    result = result_from_proto(stub.Replay(request("default<O2>", 512), timeout=20).result)
    assert result.verified and result.compile_cached, "the replay found its code compiled"
    assert (tmp_path / "log" / "compiles.log").read_text().count("default<O2>") == 1


def test_prepare_refuses_an_overlong_compile_list(serve):
    _, stub = serve(workers=1)
    listed = [request(block_x=64 + i % 900).config for i in range(4097)]
    with pytest.raises(grpc.RpcError) as err:
        stub.Prepare(replay_pb2.PrepareRequest(instance=request().instance, compile=listed), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 4096" in err.value.details()


def test_prepare_has_every_compile_process_read_the_instance(serve, tmp_path):
    _, stub = serve(workers=1, compile_processes=3)
    prepared = stub.Prepare(replay_pb2.PrepareRequest(
        instance=replay_pb2.InstanceRef(record_db=RECORD_DB, record_id=RECORD_ID)), timeout=30)
    assert prepared.workers_prepared == 1
    compiles = (tmp_path / "log" / "compiles.log").read_text().splitlines()
    assert len({line.split()[1] for line in compiles}) == 3, "each compile process read the instance"


def test_compile_processes_start_only_for_code_other_than_the_recorded(serve, tmp_path):
    """A client whose list names only the recorded launch's code (a launch-shape space) starts no compile
    process: the worker has that code; the first other code starts one."""
    import multiprocessing

    earlier = {p.pid for p in multiprocessing.active_children()}  # other tests' processes, still ending
    _, stub = serve(workers=1, compile_processes=2)
    prepared = stub.Prepare(replay_pb2.PrepareRequest(
        instance=request().instance, compile=[request("default<O3>", 64).config]), timeout=30)
    assert list(prepared.compile_errors) == [""], "the recorded code counts as compiled"
    recorded = result_from_proto(stub.Replay(request("default<O3>", 128), timeout=30).result)
    assert recorded.verified and recorded.obj_size == -1, "the worker ran the code it holds"
    compiles = tmp_path / "log" / "compiles.log"
    worker = {int(line.split()[2]) for line in runs(tmp_path / "log")}
    assert not compiles.exists() and {p.pid for p in multiprocessing.active_children()} - earlier == worker
    other = result_from_proto(stub.Replay(request("default<O2>", 64), timeout=30).result)
    assert other.verified and other.obj_size == len(b"code:default<O2>:sm_test")
    assert [line.split()[0] for line in compiles.read_text().splitlines()] == ["default<O2>"]


@pytest.fixture
def one_worker_o2_compiled(serve, tmp_path):
    """One worker, two compile processes, and the code of default<O2> compiled (one replay of it done)."""
    _, stub = serve(workers=1, compile_processes=2)
    assert result_from_proto(stub.Replay(request("default<O2>"), timeout=30).result).verified
    return stub, tmp_path / "log"


def test_a_job_whose_code_is_ready_goes_ahead_of_one_still_compiling(one_worker_o2_compiled):
    stub, log = one_worker_o2_compiled
    busy = stub.Replay.future(request("slow:0.5"), timeout=30)
    while len(runs(log)) < 2:  # the worker is busy with it
        time.sleep(0.01)
    compiling = stub.Replay.future(request("compile:1.0"), timeout=30)
    ready = stub.Replay.future(request("default<O2>", block_x=128), timeout=30)  # same code: compiled
    assert all(result_from_proto(f.result().result).verified for f in (busy, compiling, ready))
    assert [line.split()[:2] for line in runs(log)] == [
        ["default<O2>", "64"], ["slow:0.5", "64"], ["default<O2>", "128"], ["compile:1.0", "64"]]


def test_an_idle_worker_runs_ready_code_while_the_oldest_job_still_compiles(one_worker_o2_compiled):
    stub, log = one_worker_o2_compiled
    compiling = stub.Replay.future(request("compile:1.5"), timeout=30)  # first in the queue, 1.5 s compile
    time.sleep(0.2)  # the idle worker has seen it
    started = time.monotonic()
    ready = stub.Replay.future(request("default<O2>", block_x=128), timeout=30)  # compiled: runs at once
    assert result_from_proto(ready.result().result).verified
    assert time.monotonic() - started < 1.0, "the ready job waited for the other job's compile"
    assert not compiling.done()
    assert result_from_proto(compiling.result().result).verified
    assert [line.split()[:2] for line in runs(log)] == [
        ["default<O2>", "64"], ["default<O2>", "128"], ["compile:1.5", "64"]]


def test_a_database_written_again_is_prepared_again(serve, store, tmp_path, monkeypatch):
    """A server that runs long (kept for later tuners) serves the database file as it is now, not as it was."""
    import replay_server.server.service

    monkeypatch.setattr(replay_server.server.service, "REVISION_CHECK_S", 0.0)
    _, stub = serve(workers=1)
    prepare = replay_pb2.PrepareRequest(instance=request().instance)
    stub.Prepare(prepare, timeout=20)
    stub.Prepare(prepare, timeout=20)
    opens = tmp_path / "log" / "opens.log"
    assert len(opens.read_text().splitlines()) == 1, "the same database: restored once"
    (store / RECORD_DB).write_text('{"recorded": "again"}')
    stub.Prepare(prepare, timeout=20)
    assert len(opens.read_text().splitlines()) == 2, "the rewritten database: restored again"


def test_a_worker_replays_ready_configurations_of_one_instance_together(serve, tmp_path):
    """Up to ``batch`` queued configurations go to a worker in one message (one engine call where the
    engine has one), and their answers come back with every field, in one message."""
    server, stub = serve(workers=1, depth=1, batch=4)
    held = _messages(stub, [request("slow:0.02", 64 + i, f"b{i}") for i in range(8)], hold=0.0)
    assert sorted(i for _, ids in held for i in ids) == sorted(f"b{i}" for i in range(8))
    assert max(len(ids) for _, ids in held) >= 4, held


def test_when_a_worker_dies_in_a_group_each_is_replayed_alone_and_only_the_guilty_fails(serve, tmp_path):
    server, stub = serve(workers=1, depth=1, batch=8)
    stream = [request("default<O3>", 10 + i, f"ok{i}") for i in range(3)] + [request("crash", 64, "crash")] \
        + [request("default<O3>", 20 + i, f"late{i}") for i in range(3)]  # fmt: skip
    answers = {r.request_id: result_from_proto(r.result) for r in stub.ReplayStream(iter(stream), timeout=60)}
    assert answers["crash"].status == "runtime_error" and "worker died" in answers["crash"].error
    assert all(r.verified for rid, r in answers.items() if rid != "crash") and len(answers) == 7
