"""Record real programs with `mneme record`, then replay each recorded launch
with the replay engine: the baseline (the recorded code and launch) must
verify bit-exactly against the recorded epilogue. This is the contract between
the recorder and the replay engine: fixed window base, raw argument bytes,
globals restored by symbol, pointers stored in memory still valid.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_record import mneme_record, only_database, programs, recorder_lib  # noqa: F401  (fixtures)

from mneme.model.experiment import ExperimentConfiguration
from mneme.recording.execution import RecordedExecution

pytestmark = pytest.mark.gpu

COMMITTED = Path(__file__).resolve().parents[1] / "data" / "recordings" / "vecadd"


def replay_all(rec: RecordedExecution) -> list:
    try:
        from mneme.replay import Replayer
    except ImportError as exc:  # pragma: no cover
        pytest.skip(f"replay engine not available: {exc}")
    results = []
    for record_id, kernel in rec.instances.items():
        config = ExperimentConfiguration.from_dict(
            {"grid": kernel.grid_dim.to_dict(), "block": kernel.block_dim.to_dict(), "shared_mem": kernel.shared_mem}
        )
        replayer = Replayer(rec, record_id)
        try:
            results.append((record_id, replayer.run(config, iterations=2, warmup=1)))
        finally:
            close = getattr(replayer, "close", None)
            if callable(close):
                close()
    return results


def assert_verified(results):
    assert results
    for record_id, result in results:
        assert result.verified, f"{record_id}: {result.status}: {result.error} {getattr(result, 'mismatches', '')}"


def test_committed_vecadd_recording_replays():
    (db,) = COMMITTED.glob("*.json")
    assert_verified(replay_all(RecordedExecution.from_json(db)))


@pytest.mark.parametrize(
    "program,args,kernel,options",
    [
        ("vecadd_shared", [4096, 2], "vecadd", []),
        ("globals", [], "scaled_copy", []),
        ("linked_list", [], "walk", []),
        ("linked_list", [], "walk", ["--snapshot-scope", "reachable"]),
        ("iterative", [8], "relax", ["--kernel", "relax", "--instances", "0,5", "-mr", "0", "--record-duplicates"]),
        ("iterative", [2], "fill_pitched", []),
        ("driver_ptx", [], "saxpy", []),
        ("annotated", [], "softish", []),
    ],
)
def test_recorded_launches_replay_bit_exact(recorder_lib, programs, tmp_path, program, args, kernel, options):  # noqa: F811
    mneme_record(recorder_lib, tmp_path / "rdb", [programs / program, *args], *options)
    assert_verified(replay_all(only_database(tmp_path / "rdb", kernel)))


@pytest.fixture(scope="module")
def launch_attrs_rdb(recorder_lib, programs, tmp_path_factory):  # noqa: F811
    rdb = tmp_path_factory.mktemp("launch-attrs") / "rdb"
    mneme_record(recorder_lib, rdb, [programs / "launch_attrs"])
    return rdb


def cluster_dims(instance) -> tuple[int, ...]:
    """The recorded cluster dimension attribute (id 4) of an instance, decoded or raw."""
    (attr,) = [a for a in instance.launch_attributes if a.id == 4]
    return attr.value or tuple(int.from_bytes(attr.raw[i : i + 4], "little") for i in (0, 4, 8))


@pytest.mark.parametrize("kernel", ["cluster_exchange", "coop_total", "big_param"])
def test_launch_attributes_and_large_parameters_replay_bit_exact(launch_attrs_rdb, kernel):
    """Cluster dimensions and cooperative launches are recorded and repeated; an 8 KiB parameter buffer launches."""
    rec = only_database(launch_attrs_rdb, kernel)
    if kernel == "cluster_exchange":  # two launches that differ only in their cluster dimensions: two instances
        assert sorted(cluster_dims(i) for i in rec.instances.values()) == [(2, 1, 1), (4, 1, 1)]
        assert_verified(replay_all(rec))
        return
    (inst,) = rec.instances.values()
    attrs = {a.id: a for a in inst.launch_attributes}
    if kernel == "coop_total":
        assert 2 in attrs, inst.launch_attributes
    if kernel == "big_param":
        assert rec.kernel.param_buffer_size > 4096
    assert_verified(replay_all(rec))


def test_cluster_kernel_needs_its_clusters(launch_attrs_rdb):
    """Launched without the recorded cluster dimension the result differs (the check can fail); a grid that is
    not a multiple of the cluster is refused with a message naming it."""
    from mneme.replay import Replayer
    from mneme.replay.launch_attrs import LaunchPlan

    rec = only_database(launch_attrs_rdb, "cluster_exchange")
    (record_id,) = [rid for rid, inst in rec.instances.items() if cluster_dims(inst) == (2, 1, 1)]
    with Replayer(rec, record_id) as replayer:
        assert replayer.launch_plan.cluster_dim == (2, 1, 1) and "cluster_dim" in replayer.launch_plan.names
        odd = replayer.run(replayer.baseline().replace(grid={"x": 31, "y": 1, "z": 1}))
        assert odd.status == "invalid_launch" and "cluster dimension x=2" in odd.error
        replayer.launch_plan = LaunchPlan()
        assert replayer.run(replayer.baseline(), iterations=1, warmup=0).status == "failed_verification"
