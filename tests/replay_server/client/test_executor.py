"""AsyncReplayExecutor against real server processes (mneme serve with the test engine)."""

from __future__ import annotations

import collections
import json
import signal
import time

import grpc
import pytest

from mneme.errors import ConfigurationError
from mneme.model.experiment import ExperimentConfiguration
from mneme.model.verification import VerificationSettings
from replay_server.client.connection import ConnectionSettings
from replay_server.client.executor import (
    TRANSPORTS,
    AsyncReplayExecutor,
    ReplayServerError,
    server_capacity,
)
from replay_server.protocol import replay_pb2, replay_pb2_grpc
from replay_server.testing.servers import (  # noqa: F401
    ENGINE_ARGS,
    RECORD_DB,
    RECORD_ID,
    start_server,
    store,
    subprocess_env,
)


def config(passes="default<O3>", block_x=64) -> ExperimentConfiguration:
    return ExperimentConfiguration.from_dict({"block": {"x": block_x}, "passes": passes})


def most_held(info, seconds: float) -> int:
    """The most configurations a server held (running and queued) over the next ``seconds``."""
    held = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state = info(replay_pb2.ServerInfoRequest())
        held = max(held, state.in_flight + state.queue_depth)
    return held


def test_local_servers_on_every_gpu_with_more_workers_than_gpus(store, tmp_path):
    results_dir = tmp_path / "results"
    executor = AsyncReplayExecutor(
        record_db=str(store / RECORD_DB), record_id=RECORD_ID, iterations=5, results_db_dir=str(results_dir),
        num_workers=3, connection=ConnectionSettings(
            local_gpus=[0, 1], server_args=ENGINE_ARGS,
            server_env=subprocess_env(tmp_path / "log", replay_seconds=0.02)),  # replays that take time: work spreads
    )
    with executor:
        assert len(executor.servers) == 2
        executor.wait_prepared(timeout=30)  # every worker has started (a loaded machine starts them slowly)
        futures = {64 * i: executor.submit(config(block_x=64 * i)) for i in range(1, 17)}
        crashed = executor.evaluate(config("crash"))
        for block_x, future in futures.items():
            result = future.result(timeout=30)
            assert result.verified and result.exec_time == [block_x] * 7  # attached to its own configuration
        assert crashed.failed and "SIGSEGV" in crashed.error, crashed
        assert executor.evaluate({"block": {"x": 4096}}).status == "invalid_config"
        local = list(executor._local_servers.servers)
    assert all(server.process.poll() is not None for server in local), "local servers stop with the executor"
    lines = [json.loads(line) for line in (results_dir / "results.jsonl").read_text().splitlines()]
    assert len(lines) == 18 and lines[0]["record_id"] == RECORD_ID
    pids = {line.split()[2] for line in (tmp_path / "log" / "runs.log").read_text().splitlines()}
    assert len(pids) >= 3, "work went to every worker (and the crashed one's replacement)"


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "stopped"])
def test_a_server_killed_mid_run_loses_nothing_and_counts_nothing_twice(store, tmp_path, transport, how):
    # (--batch 1: each answer leaves as its replay ends, so the doomed server has answered some when killed)
    doomed, doomed_address = start_server(store, tmp_path / "log-a", "--workers", "2", "--batch", "1")
    survivor, survivor_address = start_server(store, tmp_path / "log-b", "--workers", "2")
    try:
        executor = AsyncReplayExecutor(
            record_db=str(store / RECORD_DB), record_id=RECORD_ID, iterations=1, warmup=0,
            results_db_dir=str(tmp_path / "results"), servers=[doomed_address, survivor_address],
            connection=ConnectionSettings(transport=transport),
            compile_ahead=[config("slow:0.05")],  # (both get their share at once: see the test below)
        )
        with executor:
            executor.wait_prepared(timeout=30)
            futures = [executor.submit(config("slow:0.05", block_x=i + 1)) for i in range(40)]
            while not (tmp_path / "log-a" / "runs.log").exists():
                time.sleep(0.01)
            time.sleep(0.1)
            doomed.send_signal(how)  # gone at once, or shutting down: its queued work fails UNAVAILABLE
            results = [f.result(timeout=60) for f in futures]
        assert all(r.verified for r in results), [r.error for r in results if not r.verified]
        assert [r.exec_time[0] for r in results] == list(range(1, 41))
        records = [json.loads(line) for line in (tmp_path / "results" / "results.jsonl").read_text().splitlines()]
        assert len(records) == 40 and len({r["config_hash"] for r in records}) == 40
        assert any(r["attempts"] == 2 for r in records), "work of the killed server was retried"
        assert {r["server"] for r in records} == {doomed_address, survivor_address}
    finally:
        for process in (doomed, survivor):
            process.kill()
            process.wait()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_no_server_left_gives_failed_results(store, tmp_path, transport):
    server, address = start_server(store, tmp_path / "log")
    executor = AsyncReplayExecutor(str(store / RECORD_DB), RECORD_ID, servers=[address],
                                   connection=ConnectionSettings(retry_window=1.0, transport=transport))
    try:
        assert executor.evaluate(config()).verified
        server.kill()
        server.wait()
        result = executor.evaluate(config())
        assert result.failed and "replay server lost" in result.error
    finally:
        executor.shutdown()
        server.kill()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_refusals_are_errors_not_results(store, tmp_path, transport):
    token_file = tmp_path / "token"
    token_file.write_text("t0ken")
    server, address = start_server(store, tmp_path / "log", "--token-file", str(token_file))
    try:
        with pytest.raises(ReplayServerError, match="bearer token"):
            AsyncReplayExecutor(str(store / RECORD_DB), RECORD_ID, servers=[address],
                                connection=ConnectionSettings(token="wrong", transport=transport))
        with AsyncReplayExecutor(str(store / "999.json"), RECORD_ID, servers=[address],
                                 connection=ConnectionSettings(token="t0ken", transport=transport)) as executor:
            with pytest.raises(ReplayServerError, match="NOT_FOUND"):
                executor.evaluate(config())
    finally:
        server.kill()
        server.wait()


def test_verification_settings_reach_the_engine_with_every_instance(store, tmp_path):
    server, address = start_server(store, tmp_path / "log")
    settings = VerificationSettings(mode="auto", runs=5, overrides={"acc": "f32:ulp:16", "*": "bitwise"})
    derived = settings.with_(mode="exact", derived={"out": "f32:ulp:48"})  # the bounds a tuner derived
    try:
        with AsyncReplayExecutor(str(store / RECORD_DB), RECORD_ID, servers=[address],
                                 verification=settings) as executor:
            assert executor.evaluate(config()).verified
            executor.set_verification(derived)
            assert executor.evaluate(config(block_x=128)).verified
    finally:
        server.kill()
        server.wait()
    opened = [json.loads(line) for line in (tmp_path / "log" / "instances.log").read_text().splitlines()]
    assert {VerificationSettings.from_dict(o).key() for o in opened} == {settings.key(), derived.key()}


def test_bad_verification_settings_fail_in_the_executor_before_any_server():
    with pytest.raises(ConfigurationError, match="f99"):
        AsyncReplayExecutor("db.json", "1", servers=["127.0.0.1:1"],
                            verification=VerificationSettings(overrides={"acc": "f99:ulp:1"}))


def test_no_relocate_reaches_the_servers_and_their_refusal_is_an_error(store, tmp_path):
    """The executor's verification settings travel in InstanceRef: with ``relocate=False`` a worker that cannot
    have the recorded addresses refuses the instance (FAILED_PRECONDITION, with the reason), instead of relocating."""
    server, address = start_server(store, tmp_path / "log")
    try:
        with AsyncReplayExecutor(str(store / RECORD_DB), "taken-addresses", servers=[address]) as executor:
            result = executor.evaluate(config())
            assert result.verified and result.relocated and "simulated" in result.relocation_reason
        with AsyncReplayExecutor(str(store / RECORD_DB), "taken-addresses", servers=[address],
                                 verification=VerificationSettings(relocate=False)) as executor:
            with pytest.raises(ReplayServerError, match="FAILED_PRECONDITION.*recorded addresses"):
                executor.evaluate(config())
    finally:
        server.kill()
        server.wait()


def test_servers_none_without_gpus_says_what_to_do(store):
    with pytest.raises(Exception, match="servers="):
        AsyncReplayExecutor(str(store / RECORD_DB), RECORD_ID, connection=ConnectionSettings(local_gpus=[]))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_work_waiting_for_a_busy_server_is_not_given_up(store, tmp_path, transport):
    server, address = start_server(store, tmp_path / "log")
    try:
        with AsyncReplayExecutor(str(store / RECORD_DB), RECORD_ID, servers=[address],
                                 connection=ConnectionSettings(retry_window=0.3, transport=transport)) as executor:
            futures = [executor.submit(config("slow:0.1", block_x=i + 1)) for i in range(12)]  # ~1.2 s of work
            assert all(f.result(timeout=30).verified for f in futures)
    finally:
        server.kill()
        server.wait()


def test_work_is_spread_over_both_servers_at_once(store, tmp_path):
    """Two servers of equal speed each get about half the work, and hold work at the same time."""
    started = [start_server(store, tmp_path / f"log-{i}", "--workers", "2") for i in range(2)]
    addresses = [address for _, address in started]
    infos = [replay_pb2_grpc.ReplayServiceStub(grpc.insecure_channel(a)).GetServerInfo for a in addresses]
    try:
        # The code compiled by both servers' Prepare: otherwise the first to answer for a variant still
        # compiling elsewhere takes its whole window (104 places) of it.
        with AsyncReplayExecutor(str(store / RECORD_DB), RECORD_ID, iterations=1, warmup=0, servers=addresses,
                                 results_db_dir=str(tmp_path / "results"),
                                 compile_ahead=[config("slow:0.05")]) as executor:
            executor.wait_prepared(timeout=30)
            futures = [executor.submit(config("slow:0.05", block_x=i + 1)) for i in range(60)]
            both_busy = False
            while not both_busy and not futures[-1].done():
                both_busy = all(info(replay_pb2.ServerInfoRequest()).in_flight > 0 for info in infos)
            results = [f.result(timeout=60) for f in futures]
        assert [r.exec_time[0] for r in results] == list(range(1, 61)) and all(r.verified for r in results)
        assert both_busy, "the two servers never had work in flight at the same time"
        records = [json.loads(line) for line in (tmp_path / "results" / "results.jsonl").read_text().splitlines()]
        per_server = collections.Counter(r["server"] for r in records)
        assert set(per_server) == set(addresses) and min(per_server.values()) >= 20, per_server
    finally:
        for process, _ in started:
            process.kill()
            process.wait()


def test_configurations_whose_code_is_compiled_are_not_held_back_by_a_slow_compile(store, tmp_path):
    """Ten configurations of a variant that compiles for 1.5 s come first; five of the prepared code after them.

    The server's places are not all taken by the slow variant's configurations (at most two are sent while
    its compile runs): the prepared ones run at once, before the slow compile ends.
    """
    server, address = start_server(store, tmp_path / "log", "--workers", "1")
    try:
        with AsyncReplayExecutor(str(store / RECORD_DB), RECORD_ID, iterations=1, warmup=0,
                                 servers=[address]) as executor:
            executor.wait_prepared(timeout=30)
            started = time.monotonic()
            slow = [executor.submit(config("compile:1.5", block_x=64 * (i + 1))) for i in range(10)]
            ready = [executor.submit(config(block_x=64 * (i + 1))) for i in range(5)]
            assert all(f.result(timeout=30).verified for f in ready)
            assert time.monotonic() - started < 1.2, "the prepared code waited for the slow compile"
            assert not any(f.done() for f in slow)
            assert all(f.result(timeout=30).verified for f in slow)
    finally:
        server.kill()
        server.wait()


def test_configurations_of_the_recorded_code_go_out_at_once_after_prepare(store, tmp_path):
    """Preparing compiled the recorded launch's code on the server: its configurations fill the server's
    places at once instead of two at a time until a first answer shows the code compiled."""
    server, address = start_server(store, tmp_path / "log", "--workers", "1", replay_seconds=0.3)
    info = replay_pb2_grpc.ReplayServiceStub(grpc.insecure_channel(address)).GetServerInfo
    try:
        with AsyncReplayExecutor(str(store / RECORD_DB), RECORD_ID, iterations=1, warmup=0,
                                 servers=[address]) as executor:
            executor.wait_prepared(timeout=30)
            futures = [executor.submit(config(block_x=64 * (i + 1))) for i in range(6)]
            held = most_held(info, seconds=0.25)  # before the first answer (0.3 s of replay)
            assert held == 6, f"the server held {held} of 6 configurations before the first answer"
            assert all(f.result(timeout=30).verified for f in futures)
    finally:
        server.kill()
        server.wait()


def test_code_compiled_ahead_is_compiled_once_and_its_configurations_go_out_at_once(store, tmp_path):
    """``compile_ahead``: each server compiles that code while it prepares (one compile per variant, however
    many configurations name it); its configurations then fill the server's places at once and find the
    code compiled, and code that failed to compile ahead is compiled (and its error reported) by its replays."""
    server, address = start_server(store, tmp_path / "log", "--workers", "1", replay_seconds=0.3)
    info = replay_pb2_grpc.ReplayServiceStub(grpc.insecure_channel(address)).GetServerInfo
    ahead = [config("compile:0.4", 64), config("compile:0.4", 128), config("default<O1>"), config("compile-error")]
    try:
        with AsyncReplayExecutor(str(store / RECORD_DB), RECORD_ID, iterations=1, warmup=0,
                                 servers=[address], compile_ahead=ahead) as executor:
            executor.wait_prepared(timeout=30)
            compiled = (tmp_path / "log" / "compiles.log").read_text()
            assert (compiled.count("compile:0.4"), compiled.count("default<O1>"), compiled.count("compile-error")) \
                == (1, 1, 1)
            futures = [executor.submit(config("compile:0.4", block_x=64 * (i + 1))) for i in range(6)]
            held = most_held(info, seconds=0.25)  # before the first answer (0.3 s of replay)
            assert held == 6, f"the server held {held} of 6 configurations before the first answer"
            results = [f.result(timeout=30) for f in futures]
            assert all(r.verified and r.compile_cached for r in results)
            assert executor.evaluate(config("compile-error")).verified  # its replay compiled it (the test engine)
        assert (tmp_path / "log" / "compiles.log").read_text().count("compile:0.4") == 1
    finally:
        server.kill()
        server.wait()


def test_results_file_lines_are_json_dumps_and_futures_carry_them(store, tmp_path):
    """A round's results are written together, before their futures; each line is json.dumps of its record
    (key order included), and each future carries its result's dict and text for the tuner to reuse."""
    server, address = start_server(store, tmp_path / "log", "--workers", "2")
    try:
        with AsyncReplayExecutor(str(store / RECORD_DB), RECORD_ID, iterations=2, warmup=1, servers=[address],
                                 results_db_dir=str(tmp_path / "results")) as executor:
            futures = [executor.submit(config(block_x=16 * i)) for i in range(1, 41)]
            for future in futures:
                result = future.result(timeout=30)
                assert future.result_dict == result.to_dict() and future.result_json == json.dumps(result.to_dict())
            written = (tmp_path / "results" / "results.jsonl").read_text().splitlines()
            assert len(written) == 40  # on disk once the futures are done
        records = [json.loads(line) for line in written]
        assert all(line == json.dumps(record) for line, record in zip(written, records))
        assert [list(r) for r in records[:1]] == [["record_db", "record_id", "config_hash", "config", "result",
                                                  "server", "worker", "attempts", "time"]]
        by_block = {r["config"]["block"]["x"]: r for r in records}
        for i in range(1, 41):
            record = by_block[16 * i]
            assert record["config_hash"] == config(block_x=16 * i).hash()
            assert record["result"]["exec_time"] == [16 * i] * 3
    finally:
        server.kill()
        server.wait()


def test_a_hold_beyond_what_servers_grant_is_refused():
    with pytest.raises(ConfigurationError, match="hold_responses=2"):
        ConnectionSettings(servers=["127.0.0.1:1"], hold_responses=2)


def test_compile_ahead_is_bounded():
    variants = [{"passes": f"instcombine,p{i}"} for i in range(4097)]
    with pytest.raises(ConfigurationError, match="at most 4096"):
        AsyncReplayExecutor("db.json", RECORD_ID, servers=["127.0.0.1:1"], compile_ahead=variants)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_server_holds_as_many_configurations_as_its_transport_allows(store, tmp_path, transport, monkeypatch):
    """The stream transport keeps a deeper queue in each server than unary calls (which share its
    RPC threads): before the first answer, the server holds ``server_capacity(workers, transport)``.

    Over a stream, the idle server's first ``FIRST_MESSAGE`` requests leave as a message of their own
    (a full window takes milliseconds of Python to prepare, and its workers and compiles start on the
    first ones); the rest of its places are filled right after, not after an answer."""
    import replay_server.client.executor as executor_module

    messages: list[int] = []
    sent_at: list[float] = []
    send = executor_module._Stream.send
    monkeypatch.setattr(executor_module._Stream, "send",
                        lambda stream, requests: (messages.append(len(requests)), sent_at.append(time.monotonic()),
                                                  send(stream, requests))[-1])
    server, address = start_server(store, tmp_path / "log", "--workers", "2", replay_seconds=0.3)
    info = replay_pb2_grpc.ReplayServiceStub(grpc.insecure_channel(address)).GetServerInfo
    try:
        with AsyncReplayExecutor(str(store / RECORD_DB), RECORD_ID, iterations=1, warmup=0,
                                 servers=[address], connection=ConnectionSettings(transport=transport)) as executor:
            executor.wait_prepared(timeout=30)
            futures = [executor.submit(config(block_x=i + 1)) for i in range(120)]
            held = 0
            submitted = time.monotonic()
            deadline = submitted + 0.25  # before the first answer (0.3 s of replay)
            while time.monotonic() < deadline:
                state = info(replay_pb2.ServerInfoRequest())
                held = max(held, state.in_flight + state.queue_depth)
            assert held == server_capacity(2, transport) == {"stream": 104, "unary": 12}[transport]
            if transport == "stream":
                assert messages[0] <= executor_module.FIRST_MESSAGE < held, messages
                # (the submits race the sender: how many messages it takes varies, that they all leave at once not)
                before_an_answer = [n for n, t in zip(messages, sent_at) if t < deadline]
                assert sum(before_an_answer) >= held, (messages, [round(t - submitted, 3) for t in sent_at])
            assert [f.result(timeout=60).exec_time[0] for f in futures] == list(range(1, 121))
    finally:
        server.kill()
        server.wait()
