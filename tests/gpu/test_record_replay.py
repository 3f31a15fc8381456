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

from mneme.mneme_types import ExperimentConfiguration
from mneme.recorded_execution import RecordedExecution

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
