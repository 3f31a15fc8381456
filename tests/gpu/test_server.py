"""GPU tests of the replay server with the real engine (mneme.replay) in its workers.

Good configurations are mixed with ones that trap, write to an illegal address
or spin forever (mneme/testing/data/faulty.cu); every good one must still
verify, each bad one must come back as a failed result with its reason, and
the server must keep serving (workers replaced, health SERVING).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from mneme.model.experiment import ExperimentConfiguration
from mneme.testing.faulty_recording import (
    ILLEGAL_ADDRESS_BLOCK,
    SPIN_BLOCK,
    TRAP_BLOCK,
    write_faulty_recording,
)
from mneme.testing.gpu import child_env
from replay_server.protocol import (
    health_pb2,
    health_pb2_grpc,
    replay_pb2,
    replay_pb2_grpc,
)
from replay_server.protocol.convert import config_to_proto, result_from_proto

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.gpu
GOOD_BLOCKS = (64, 128, 192, 256, 512, 1024)
BAD_BLOCKS = (TRAP_BLOCK, ILLEGAL_ADDRESS_BLOCK, SPIN_BLOCK)
WATCHDOG = 5.0


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    directory = tmp_path_factory.mktemp("faulty")
    path, record_id = write_faulty_recording(directory)
    return directory, path, record_id


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MNEME_CACHE_DIR", str(tmp_path / "cache"))  # workers and compile pool inherit it


def _config(path, block_x: int, record_id: str | None = None, **knobs) -> ExperimentConfiguration:
    from mneme.recording.execution import RecordedExecution

    execution = RecordedExecution.from_json(str(path))
    instance = execution.instances[record_id] if record_id else execution.single_instance()
    return ExperimentConfiguration.from_dict({
        "grid": instance.grid_dim.to_dict(), "block": {"x": block_x}, "shared_mem": 0, **knobs,
    })


def test_good_configurations_verify_while_bad_ones_fault_or_hang(faulty):
    from replay_server.server.serve import ReplayServer, ServerOptions

    directory, path, record_id = faulty
    server = ReplayServer(ServerOptions(
        gpu=0, port=0, host="127.0.0.1", store=str(directory), workers=2, watchdog=WATCHDOG, startup_timeout=120,
    ))
    port = server.start()
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = replay_pb2_grpc.ReplayServiceStub(channel)
        # PTX tier too (codegen_opt 2 recompiles through the compile pool), then the mix, twice over.
        plan = [(b, {}) for b in GOOD_BLOCKS] + [(256, {"codegen_opt": 2})]
        for bad in BAD_BLOCKS:
            plan += [(bad, {}), (GOOD_BLOCKS[bad % len(GOOD_BLOCKS)], {})]
        plan += plan
        requests = [
            replay_pb2.ReplayRequest(
                request_id=f"{i}:{block_x}", iterations=5, warmup=2,
                instance=replay_pb2.InstanceRef(record_db=path.name, record_id=record_id),
                config=config_to_proto(_config(path, block_x, **knobs)),
            )
            for i, (block_x, knobs) in enumerate(plan)
        ]
        results = {r.request_id: result_from_proto(r.result)
                   for r in stub.ReplayStream(iter(requests), timeout=20 * WATCHDOG * len(BAD_BLOCKS) + 300)}
        assert set(results) == {r.request_id for r in requests}
        for request_id, result in results.items():
            block_x = int(request_id.split(":")[1])
            if block_x == SPIN_BLOCK:
                assert result.failed and result.status == "timeout", result.error
            elif block_x in BAD_BLOCKS:
                assert result.failed and not result.verified and result.error, (block_x, result.status)
            else:
                assert result.verified, (block_x, result.status, result.error)
                assert len(result.exec_time) == 7 and all(t > 0 for t in result.exec_time)
        info = stub.GetServerInfo(replay_pb2.ServerInfoRequest())
        assert info.worker_restarts >= 2 * len(BAD_BLOCKS) - 2  # a trap may be answered before its worker retires
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
        after = stub.Replay(requests[0], timeout=120)  # and it keeps serving
        assert result_from_proto(after.result).verified
    finally:
        server.stop()


@pytest.mark.parametrize("batch", [2, 1])
def test_a_good_group_pipelined_ahead_of_a_spinning_one_is_answered_at_once(tmp_path_factory, batch):
    """One worker, groups of ``batch``: good configurations, then a group with one that spins forever, enqueued
    behind them on the same GPU stream (or, one configuration a group, replayed when answered). The good
    ones ahead must be answered well within the watchdog (their results wait for nothing enqueued after
    them), the spinning one time out, and the good one beside it verify. The good ones ahead and the spinning
    group are of two instances, so no group mixes them, however the stream's messages arrive."""
    import time

    from replay_server.server.serve import ReplayServer, ServerOptions

    directory = tmp_path_factory.mktemp("two-instances")
    path, ahead_id = write_faulty_recording(directory)
    same_path, spin_id = write_faulty_recording(directory, n=1 << 15, offset=32 << 20)
    assert same_path == path and spin_id != ahead_id
    server = ReplayServer(ServerOptions(
        gpu=0, port=0, host="127.0.0.1", store=str(directory), workers=1, depth=2, batch=batch,
        watchdog=WATCHDOG, startup_timeout=120,
    ))
    port = server.start()
    try:
        stub = replay_pb2_grpc.ReplayServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))

        def request(name: str, block_x: int, record_id: str) -> replay_pb2.ReplayRequest:
            return replay_pb2.ReplayRequest(
                request_id=f"{name}:{block_x}", iterations=5, warmup=2,
                instance=replay_pb2.InstanceRef(record_db=path.name, record_id=record_id),
                config=config_to_proto(_config(path, block_x, record_id)),
            )

        for record_id in (ahead_id, spin_id):  # prepared, the code loaded: what follows is the GPU's
            warm = stub.Replay(request("warm", 128, record_id), timeout=300)
            assert result_from_proto(warm.result).verified
        plan = [request("ahead0", 128, ahead_id), request("ahead1", 256, ahead_id),
                request("spin", SPIN_BLOCK, spin_id), request("beside", 512, spin_id)]
        started = time.monotonic()
        arrived = {}
        for response in stub.ReplayStream(iter(plan), timeout=10 * WATCHDOG + 120):
            arrived[response.request_id] = (time.monotonic() - started, result_from_proto(response.result))
        assert set(arrived) == {r.request_id for r in plan}
        for name in ("ahead0:128", "ahead1:256"):
            seconds, result = arrived[name]
            assert result.verified, (name, result.status, result.error)
            assert seconds < WATCHDOG / 2, f"{name} answered after {seconds:.1f}s: it waited for the spinning kernel"
        spin = arrived[f"spin:{SPIN_BLOCK}"][1]
        assert spin.failed and spin.status == "timeout", spin.error
        assert arrived["beside:512"][1].verified, arrived["beside:512"][1].error
    finally:
        server.stop()


def test_async_executor_with_local_servers(faulty, tmp_path):
    from replay_server.client.executor import AsyncReplayExecutor

    directory, path, record_id = faulty
    with AsyncReplayExecutor(
        record_db=str(path), record_id=record_id, iterations=5, results_db_dir=str(tmp_path / "results"),
        num_workers=2, timeout_seconds=WATCHDOG,
    ) as executor:
        futures = [executor.submit(_config(path, b)) for b in (128, TRAP_BLOCK, 256, SPIN_BLOCK, 512)]
        results = [f.result(timeout=600) for f in futures]
    assert [r.verified for r in results] == [True, False, True, False, True], [(r.status, r.error) for r in results]
    assert results[1].failed and results[3].status == "timeout"
    assert len((tmp_path / "results" / "results.jsonl").read_text().splitlines()) == 5


def test_code_compiled_ahead_by_prepare_is_what_the_replays_run(faulty, tmp_path):
    """compile_ahead: the server compiles each named code variant (nvPTXCompiler or ptxas) while it prepares;
    the replays of those variants find their code compiled and verify."""
    from replay_server.client.executor import AsyncReplayExecutor

    directory, path, record_id = faulty
    ahead = [_config(path, 128, codegen_opt=level) for level in range(5)]
    with AsyncReplayExecutor(record_db=str(path), record_id=record_id, iterations=3, num_workers=1,
                             compile_ahead=ahead) as executor:
        executor.wait_prepared(timeout=300)
        results = [f.result(timeout=300) for f in
                   [executor.submit(_config(path, block, codegen_opt=level)) for level in range(5) for block in (64, 256)]]
    assert all(r.verified for r in results), [r.error for r in results if not r.verified]
    # codegen_opt 3 is the recorded launch's code: the worker runs the cubin it holds, nothing is compiled
    recompiled = [r for level, r in zip([level for level in range(5) for _ in (64, 256)], results) if level != 3]
    assert all(r.compile_cached for r in recompiled), "a replay compiled code that Prepare had compiled"


def test_two_gpus_each_get_a_server_and_share_the_work(tmp_path):
    """The embedded default on a machine with two or more GPUs: one server per GPU, several workers each."""
    import collections
    import json

    from mneme._internal.devices import visible_gpu_count
    from mneme.testing.synthetic import write_vecadd_recording
    from replay_server.client.executor import AsyncReplayExecutor

    gpus = visible_gpu_count()
    if gpus < 2:
        pytest.skip(f"needs two GPUs, this machine shows {gpus}: run it on a two-GPU machine (nvidia-h200-x2)")
    n = 1 << 20
    recording = write_vecadd_recording(str(tmp_path / "rec"), n=n, block=256)
    configs = [ExperimentConfiguration.from_dict({"grid": {"x": -(-n // b)}, "block": {"x": b}, "codegen_opt": opt})
               for b in range(64, 1025, 64) for opt in range(5)]
    with AsyncReplayExecutor(  # no servers, no local_gpus: every visible GPU, two workers on each
        record_db=recording.path, record_id=recording.dynamic_hash, iterations=5,
        results_db_dir=str(tmp_path / "results"), num_workers=2 * gpus, timeout_seconds=WATCHDOG,
    ) as executor:
        assert len(executor.servers) == gpus
        executor.wait_prepared(timeout=300)
        results = [f.result(timeout=600) for f in [executor.submit(c) for c in configs]]
    assert all(r.verified for r in results), [(r.status, r.error) for r in results if not r.verified][:3]
    per_gpu = collections.Counter(r.gpu_id for r in results)
    assert sorted(per_gpu) == list(range(gpus)) and min(per_gpu.values()) >= len(configs) // (3 * gpus), per_gpu
    lines = (tmp_path / "results" / "results.jsonl").read_text().splitlines()
    workers = {json.loads(line)["worker"] for line in lines}
    assert workers == {f"gpu{g}/w{w}" for g in range(gpus) for w in range(2)}, workers


def _run_example(script: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    from mneme.testing.synthetic import write_vecadd_recording

    recording = write_vecadd_recording(str(tmp_path / "rec"), n=1 << 20, block=256)
    env = child_env(MNEME_CACHE_DIR=str(tmp_path / "cache"))
    return subprocess.run(
        [sys.executable, str(script), "--record-db", recording.path, "--record-id", recording.dynamic_hash],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )


def test_our_tuning_example_prints_best(tmp_path):
    done = _run_example(REPO / "examples" / "tuning_vecadd_exhaustive.py", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "BEST: " in done.stdout


def reference_example_script() -> str | None:
    """The reference's tuning example, taken verbatim from its documentation (not part of this repo).

    Looked up in ../shared/spec beside the checkout, in .spec/ inside it (a git-ignored
    copy carried to GPU machines), or at $MNEME_REFERENCE_SPEC.
    """
    candidates = [os.environ.get("MNEME_REFERENCE_SPEC", ""),
                  REPO.parent / "shared" / "spec" / "tuning-a-recorded-kernel.txt",
                  REPO / ".spec" / "tuning-a-recorded-kernel.txt"]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            text = Path(candidate).read_text()
            start = text.index('"""\nMneme tuning example')
            end = text.index("raise SystemExit(main(sys.argv[1:]))", start)
            return text[start:end] + "raise SystemExit(main(sys.argv[1:]))\n"
    return None


def test_reference_tuning_example_unmodified_prints_best(tmp_path):
    """The reference's example script, unmodified but for its paths, through local servers."""
    source = reference_example_script()
    if source is None:
        pytest.skip("the reference documentation (tuning-a-recorded-kernel.txt) is not beside this checkout")
    script = tmp_path / "reference_tuning_example.py"
    script.write_text(source)
    done = _run_example(script, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "BEST: " in done.stdout
    assert "Total tuning time:" in done.stdout
