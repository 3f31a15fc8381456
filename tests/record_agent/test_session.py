"""A whole recording run on the CPU: the application is a Python script that
plays the recorder's part (it writes the spool as the contract says), so the
agent's process handling is tested for real: output and exit status pass
through, signals are forwarded, a crash keeps what was committed, write
errors end with a clear message."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from mneme.recording.execution import RecordedExecution
from record_agent import session
from record_agent.options import RecordOptions


def fake_app(tmp_path: Path, body: str) -> tuple[str, ...]:
    script = tmp_path / "app.py"
    script.write_text(
        "import os, sys, json, signal, time\n"
        "from record_agent.testing import write_entry, write_module\n"
        "from pathlib import Path\n"
        "spool = Path(os.environ['MNEME_SPOOL_DIR'])\n"
        "(spool / 'recorder.json').write_text(json.dumps({'format': 'mneme-spool/1'}))\n"
        + body
    )
    return (sys.executable, str(script))


@pytest.fixture(autouse=True)
def harmless_preload(monkeypatch):
    # The native recorder needs a GPU; preload the C library instead (plumbing only).
    monkeypatch.setattr(session, "recorder_library", lambda env: "libc.so.6")
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK", raising=False)


def options(tmp_path, command, **kw):
    return RecordOptions(command=command, record_db_dir=str(tmp_path / "rdb"), **kw)


def env_without_ranks():
    return {k: v for k, v in os.environ.items() if k not in ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "FLUX_TASK_RANK", "PMIX_RANK")}


def test_output_and_exit_status_pass_through(tmp_path, capfd):
    app = fake_app(tmp_path, "write_module(spool)\nwrite_entry(spool, 0)\nprint('app says hi')\nsys.exit(5)\n")
    summary = session.record(options(tmp_path, app), env=env_without_ranks())
    out = capfd.readouterr()
    assert "app says hi" in out.out and summary.exit_code == 5
    assert summary.instances == 1 and "recorded 1 instance(s) of 1 kernel(s)" in out.err
    (db,) = (tmp_path / "rdb").glob("*.json")
    assert len(RecordedExecution.from_json(db).instances) == 1


def test_killed_application_leaves_valid_databases(tmp_path, capfd):
    app = fake_app(
        tmp_path,
        "write_module(spool)\nwrite_entry(spool, 0)\nwrite_entry(spool, 1, committed=False, k=1)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n",
    )
    summary = session.record(options(tmp_path, app), env=env_without_ranks())
    assert summary.exit_code == 128 + signal.SIGKILL and summary.instances == 1 and summary.abandoned == 1
    (db,) = (tmp_path / "rdb").glob("*.json")
    RecordedExecution.from_json(db)
    assert "were being recorded when the application ended" in capfd.readouterr().err


def test_sigterm_to_the_agent_reaches_the_application(tmp_path):
    marker = tmp_path / "got-term"
    app = fake_app(
        tmp_path,
        f"signal.signal(signal.SIGTERM, lambda *a: (Path({str(marker)!r}).write_text('x'), sys.exit(7)))\n"
        "time.sleep(30)\n",
    )
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        summary = session.record(options(tmp_path, app), env=env_without_ranks())
    finally:
        timer.cancel()
    assert marker.exists() and summary.exit_code == 7


def test_unselected_rank_runs_unrecorded(tmp_path):
    app = fake_app(tmp_path, "sys.exit(3)\n")  # would fail: no spool variable outside recording
    env = dict(env_without_ranks(), PMI_RANK="2")
    summary = session.record(options(tmp_path, (sys.executable, "-c", "import sys, os; sys.exit(4 if 'MNEME_SPOOL_DIR' in os.environ else 9)")), env=env)
    assert summary.exit_code == 9 and not summary.recorded and not (tmp_path / "rdb").exists()
    del app


def test_rank_gets_its_own_directory(tmp_path):
    app = fake_app(tmp_path, "write_module(spool)\nwrite_entry(spool, 0)\n")
    env = dict(env_without_ranks(), SLURM_PROCID="2")
    summary = session.record(options(tmp_path, app, record_ranks=None), env=env)
    assert summary.rank == 2 and list((tmp_path / "rdb" / "rank2").glob("*.json"))


def test_write_error_is_reported_and_no_database_appears(tmp_path, capfd):
    (tmp_path / "rdb").mkdir()
    (tmp_path / "rdb" / "chunks").write_text("not a directory")  # every chunk write fails
    app = fake_app(tmp_path, "write_module(spool)\nwrite_entry(spool, 0)\ntime.sleep(0.3)\n")
    summary = session.record(options(tmp_path, app), env=env_without_ranks())
    assert summary.exit_code == 0 and summary.errors
    assert "writing the recording failed" in capfd.readouterr().err
    assert not list((tmp_path / "rdb").glob("*.json"))


def test_missing_application_is_a_clear_error(tmp_path):
    from mneme.errors import NotAvailableError

    with pytest.raises(NotAvailableError, match="check the path"):
        session.record(options(tmp_path, ("/no/such/app",)), env=env_without_ranks())


def test_summary_says_how_much_was_captured_and_the_stall_and_stats_file_has_every_instance(tmp_path, capfd):
    app = fake_app(tmp_path, "write_module(spool)\nwrite_entry(spool, 0)\nwrite_entry(spool, 1, k=1)\n")
    stats_file = tmp_path / "stats.json"
    summary = session.record(options(tmp_path, app), env=dict(env_without_ranks(), MNEME_RECORD_STATS=str(stats_file)))
    err = capfd.readouterr().err
    assert summary.instances == 2 and summary.snapshot_bytes > 0 and summary.stall_s == pytest.approx(0.004)
    assert "of device state captured" in err and "the application stalled 0.00 s for snapshots" in err
    stats = json.loads(stats_file.read_text())
    assert [e["seq"] for e in stats["entries"]] == [0, 1]
    assert stats["snapshot_bytes"] == summary.snapshot_bytes and stats["app_s"] > 0
    first, second = (e["pipeline"] for e in stats["entries"])
    assert first["bytes"] == stats["entries"][0]["snapshot_bytes"]
    # The second launch repeats the inputs of the first: named from the index, not hashed again.
    assert second["known_bytes"] > 0 and second["hashed_bytes"] < second["bytes"]


def test_recording_fsyncs_nothing_by_default_and_syncs_before_each_database_with_durable(tmp_path, monkeypatch):
    """Default: whole objects through renames, nothing waits for the disk. --durable: a syncfs before each
    database is committed and an fsync of it (docs/recording.md, Robustness)."""
    import mneme.store.local as local

    calls = []
    monkeypatch.setattr(local, "_sync_file_system", lambda d: calls.append("syncfs"))
    monkeypatch.setattr(local.os, "fsync", lambda fd: calls.append("fsync"))
    app = fake_app(tmp_path, "write_module(spool)\nwrite_entry(spool, 0)\nwrite_entry(spool, 1, k=1)\n")
    assert session.record(options(tmp_path, app), env=env_without_ranks()).instances == 2
    assert calls == []
    durable = RecordOptions(command=app, record_db_dir=str(tmp_path / "durable"), durable=True)
    assert session.record(durable, env=env_without_ranks()).instances == 2
    assert calls.count("syncfs") == 2 and "fsync" in calls  # one per committed database, then the database itself


def test_the_application_run_is_timed_to_its_exit_not_to_when_a_conversion_noticed_it(tmp_path, monkeypatch):
    """A conversion running when the application exits does not lengthen the application's reported run."""
    import time

    from record_agent.convert import SpoolConverter

    real = SpoolConverter.convert_ready

    def slow(self, progress=None):
        done = real(self, progress)
        if done:
            time.sleep(3.0)  # a long conversion: the application exits meanwhile
        return done

    monkeypatch.setattr(SpoolConverter, "convert_ready", slow)
    app = fake_app(tmp_path, "write_module(spool)\nwrite_entry(spool, 0)\n")
    summary = session.record(options(tmp_path, app), env=env_without_ranks())
    assert summary.instances == 1
    assert summary.app_s < 2.5 and summary.app_s + summary.after_exit_s >= 3.0
