"""Start-up trace points reach the trace file from every process of a run (the variable is inherited)."""

from __future__ import annotations

from mneme._internal import startup_trace
from mneme.model.experiment import ExperimentConfiguration
from replay_server.client.connection import ConnectionSettings
from replay_server.client.executor import AsyncReplayExecutor
from replay_server.testing.servers import (  # noqa: F401
    ENGINE_ARGS,
    RECORD_DB,
    RECORD_ID,
    store,
    subprocess_env,
)


def test_points_of_the_executor_its_server_and_its_workers(store, tmp_path, monkeypatch):
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv(startup_trace.ENV, str(trace))
    with AsyncReplayExecutor(
        record_db=str(store / RECORD_DB), record_id=RECORD_ID, iterations=3, num_workers=1,
        connection=ConnectionSettings(local_gpus=[0], server_args=ENGINE_ARGS, server_env=subprocess_env(tmp_path / "log")),
    ) as executor:
        for block_x in (64, 128, 256):
            assert executor.evaluate(ExperimentConfiguration.from_dict({"block": {"x": block_x}})).verified
    points = startup_trace.read(trace)
    seen = [(p["role"], p["point"]) for p in points]
    for expected in [("executor", "spawn"), ("server", "listening"), ("worker", "start"), ("worker", "self_test"),
                     ("executor", "listening"), ("executor", "connected"), ("executor", "result")]:
        assert expected in seen, (expected, seen)
    assert [p["index"] for p in points if p["point"] == "result"] == [1, 2]  # only the first two results
    assert len({p["pid"] for p in points}) >= 3  # this process, the server, its worker
    assert seen.index(("executor", "spawn")) < seen.index(("server", "listening")) < seen.index(("executor", "result"))


def test_no_trace_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(startup_trace.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    startup_trace.mark("test", "point")
    assert not list(tmp_path.iterdir())
