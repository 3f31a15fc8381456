"""Replaying real recordings: the committed ones and every instance the recorder's test programs record.

The programs (tests/gpu/programs, examples/vecadd) are recorded unmodified with
`mneme record` (fixtures of test_record.py), then every recorded instance is
replayed: the baseline must verify bitwise on every launch, and a recompiled
variant (PTX tier) must verify too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_record import mneme_record, programs, recorder_lib  # noqa: F401  (fixtures)

from mneme.model.verification import VerificationSettings
from mneme.recording.execution import RecordedExecution

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
COMMITTED = sorted((ROOT / "tests" / "data" / "recordings").glob("*/*.json"))

# (program, arguments, extra `mneme record` options)
PROGRAMS = [
    ("vecadd", [4096, 2], []),
    ("vecadd_shared", [4096, 1], []),
    ("globals", [], []),
    ("linked_list", [], []),
    ("iterative", [3], []),
    ("driver_ptx", [], []),
    ("annotated", [], []),
]


def replay_all(db: Path) -> list[str]:
    """Replay every instance of ``db``; the problems found, as text."""
    from mneme.replay import Replayer

    rec = RecordedExecution.from_json(str(db))
    problems = []
    for rid in rec:
        with Replayer(rec, rid, verification=VerificationSettings(every_iteration=True)) as replayer:
            base = replayer.run(replayer.baseline(), iterations=3, warmup=1)
            if base.status != "verified":
                problems.append(f"{db.name} {rec.kernel_name} {rid} baseline: {base.status}: {base.error}")
            if rec.code.ptx is not None:
                variant = replayer.run(replayer.baseline().replace(codegen_opt=1), iterations=2, warmup=1)
                if variant.status != "verified":
                    problems.append(f"{db.name} {rec.kernel_name} {rid} codegen_opt=1: {variant.status}: {variant.error}")
    return problems


@pytest.mark.parametrize("db", COMMITTED, ids=lambda p: p.parent.name)
def test_committed_recordings_replay_bitwise(db):
    assert replay_all(db) == []


@pytest.mark.parametrize("program,argv,options", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_every_recorded_instance_of_the_test_programs_replays(recorder_lib, programs, tmp_path, program, argv, options):  # noqa: F811
    rdb = tmp_path / "rdb"
    mneme_record(recorder_lib, rdb, [programs / program, *argv], *options)
    databases = sorted(rdb.glob("*.json"))
    assert databases, f"{program} recorded nothing"
    problems = [p for db in databases for p in replay_all(db)]
    assert problems == []
