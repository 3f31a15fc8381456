"""Exact addresses in fresh replay processes: the GPU proof of mneme.replay.placement (issue #18).

A program recorded with `mneme record` must replay in brand-new `mneme replay`
processes with its heap at the recorded addresses, every time (`relocated` false);
where a process cannot have them, relocation is a reported fallback (the reason in
the result) that `--no-relocate` refuses with exit status 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_record import mneme_record, only_database, programs, recorder_lib  # noqa: F401 (fixtures)

import mneme.testing.synthetic_recordings as synth
from mneme.errors import RelocationRefusedError
from mneme.model.verification import VerificationSettings
from mneme.recording.execution import RecordedExecution
from mneme.recording.window import DEFAULT_VA_BASE, FALLBACK_VA_BASES
from mneme.testing.gpu import child_env

pytestmark = pytest.mark.gpu
FRESH_PROCESSES = 8
OLD_RECORDING = Path(__file__).resolve().parents[1] / "data" / "recordings" / "vecadd"  # made at 0x7f0000000000


def replay_json(db: Path, *flags: str) -> tuple[int, dict | None, str]:
    proc = subprocess.run([sys.executable, "-m", "mneme", "replay", "-rdb", str(db), "--json", *flags],
                          env=child_env(), capture_output=True, text=True, timeout=240)
    result = json.loads(proc.stdout)["Result"] if proc.stdout.strip() else None
    return proc.returncode, result, proc.stderr


def test_recorded_program_replays_without_relocation_in_every_fresh_process(recorder_lib, programs, tmp_path):
    rdb = tmp_path / "rdb"
    mneme_record(recorder_lib, rdb, [programs / "vecadd", 1 << 16, 1])
    rec = only_database(rdb, "vecadd")
    assert rec.address_space.mode == "fixed" and rec.address_space.base in (DEFAULT_VA_BASE, *FALLBACK_VA_BASES)
    db = rdb / rec.database_name
    for i in range(FRESH_PROCESSES):
        rc, result, err = replay_json(db, *(("--no-relocate",) if i % 2 else ()))
        assert rc == 0 and result["verified"], (i, err)
        assert result["relocated"] is False and result["relocation_reason"] == "", (i, result["relocation_reason"])


def test_an_old_recording_at_0x7f_replays_exactly_or_says_why(tmp_path):
    """Recorded at the old default base, in the mmap zone: exact when the range is free in the process,
    otherwise relocated with the reason (and refused with --no-relocate)."""
    (db,) = OLD_RECORDING.glob("*.json")
    for _ in range(4):
        rc, result, err = replay_json(db)
        assert rc == 0 and result["verified"], err
        assert result["relocated"] == bool(result["relocation_reason"])
        if result["relocated"]:
            assert "reserving 0x7f" in result["relocation_reason"], result["relocation_reason"]
        rc, result, err = replay_json(db, "--no-relocate")
        assert rc in (0, 2), err
        if rc == 2:
            assert "--no-relocate" in err and "recorded addresses" in err


def test_one_process_holds_recordings_at_several_bases_and_reports_a_busy_range(tmp_path):
    from mneme.replay import Replayer

    new = RecordedExecution.from_json(str(synth.vecadd(tmp_path / "new", n=1 << 16, block=256)))
    assert new.address_space.base == DEFAULT_VA_BASE
    old = RecordedExecution.from_json(str(next(OLD_RECORDING.glob("*.json"))))
    with Replayer(new, new.single_instance().record_id) as first, \
            Replayer(old, old.single_instance().record_id) as other_base:
        assert not first.relocated_heap, first.relocation_reason
        assert other_base.relocated_heap == bool(other_base.relocation_reason)
        for replayer in (first, other_base):
            assert replayer.run(replayer.baseline()).verified
        with Replayer(new, new.single_instance().record_id) as second:  # the same pages, leased by `first`
            assert second.relocated_heap and "in use by another replay in this process" in second.relocation_reason
            result = second.run(second.baseline())
            assert result.verified and result.relocated and result.relocation_reason == second.relocation_reason
        with pytest.raises(RelocationRefusedError, match="in use by another replay"):
            Replayer(new, new.single_instance().record_id, verification=VerificationSettings(relocate=False))
    with Replayer(new, new.single_instance().record_id, verification=VerificationSettings(relocate=False)) as again:  # released: placed again
        assert not again.relocated_heap


def test_the_driver_maps_nothing_in_the_recorder_windows_of_a_fresh_replay_process():
    """After the CUDA context and a first allocation (the driver's own early ranges), the windows are free.
    (A raw engine context: open_context would hold the default windows itself, which is the point of it.)"""
    code = textwrap.dedent(f"""
        from mneme.replay.address_map import mappings_in, read_maps
        from mneme.replay.engine import require_driver
        ctx = require_driver().Context(0)
        buffers = [ctx.alloc(n) for n in (1 << 20, 64 << 20, 1 << 30)]
        maps = read_maps()
        for base in {[DEFAULT_VA_BASE, *FALLBACK_VA_BASES]}:
            print(base, [m.describe() for m in mappings_in(base, base + 8 * (64 << 30), maps)])
        print("driver mappings", len(maps))
    """)
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True,
                             timeout=120, check=True).stdout
        for line in out.splitlines()[:-1]:
            assert line.endswith(" []"), line
