"""Instances the recorder abandoned at a deadline (docs/recording.md, Threads and deadlines), on the CPU:
the agent writes them with ``supported: false`` and the reason, `mneme ls` counts them, replay refuses them,
and `mneme record` passes the application's output and exit status through unchanged. Also: entries are
converted in commit order even when a directory listing misses one, and the --deadline option."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_session import fake_app

from mneme.cli import build_parser, main
from mneme.format import RecorderInfo
from mneme.format.hashing import static_hash
from mneme.recording.execution import RecordedExecution
from mneme.store import open_store
from mneme.testing import vecadd_code
from record_agent import session
from record_agent import spool as spool_module
from record_agent.convert import SpoolConverter
from record_agent.options import RecordOptions
from record_agent.spool import read_entry
from record_agent.testing import KERNEL, write_abandoned_entry, write_entry, write_module

REASON = "the prologue snapshot (3.1 kB) did not finish within 1.0 s (the deadline)"


def converter(spool: Path, out: Path) -> SpoolConverter:
    return SpoolConverter(spool, open_store(out), executable=None,
                          recorder=RecorderInfo("t", "host", None, "2026-01-01T00:00:00Z", ("app",)))


def database(out: Path) -> Path:
    return out / f"{static_hash(KERNEL, vecadd_code.PTX)}.json"


def test_an_abandoned_entry_is_read_without_snapshot_files(tmp_path):
    spool = tmp_path / "spool"
    write_module(spool)
    entry = read_entry(write_abandoned_entry(spool, 0, REASON))
    assert entry.abandoned == REASON and entry.regions == () and entry.stripes == 0
    assert not list(entry.path.glob("*.bin"))


def test_an_abandoned_instance_is_written_unsupported_with_its_reason_and_refused(tmp_path, capsys):
    spool, out = tmp_path / "spool", tmp_path / "out"
    write_module(spool)
    write_entry(spool, 0, n=256, k=0)
    write_abandoned_entry(spool, 1, REASON, n=256, k=1, launch_index=1)
    conv = converter(spool, out)
    assert conv.convert_ready() == 2
    assert conv.stats.instances == 2 and len(conv.stats.entries) == 1
    assert conv.stats.abandoned == [(KERNEL, REASON)]
    assert not list((spool / "entries").iterdir())  # both converted and removed

    db = database(out)
    rec = RecordedExecution.from_json(db)
    unsupported = [i for i in rec.instances.values() if not i.supported]
    (inst,) = unsupported
    (reason,) = inst.unsupported
    assert reason.startswith(f"the recorder abandoned this launch: {REASON}")
    assert inst.launch_index == 1 and inst.pointer_args == (0, 8, 16)  # its launch is described all the same
    assert inst.load_prologue().regions == () and inst.load_epilogue().regions == ()
    stored = json.loads(db.read_text())["instances"][inst.record_id]
    assert stored["supported"] is False and stored["unsupported"] == [reason]

    assert main(["ls", str(out)]) == 0
    listed = capsys.readouterr().out
    assert "2 (1 unsupported)" in listed and "1 unsupported" in listed
    assert main(["ls", "--long", str(out)]) == 0
    assert "unsupported: the recorder abandoned this launch" in " ".join(capsys.readouterr().out.split())
    assert main(["replay", "-rdb", str(db), "-rid", inst.record_id]) == 2
    assert "the recorder abandoned this launch" in capsys.readouterr().err


def test_an_abandoned_entry_with_regions_is_refused(tmp_path):
    spool = tmp_path / "spool"
    write_module(spool)
    path = write_entry(spool, 0)
    data = json.loads((path / "launch.json").read_text())
    data["abandoned"] = REASON
    (path / "launch.json").write_text(json.dumps(data))
    with pytest.raises(Exception, match="abandoned entry lists snapshot regions"):
        read_entry(path)


def test_entries_are_converted_in_commit_order_when_a_listing_misses_one(tmp_path, monkeypatch):
    """A listing taken while the recorder renames entries into place may show entry 1 without entry 0, which
    entry 1 may name (a piece it did not copy); the agent lists again and converts up to what it first saw."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    write_module(spool)
    digests: set = set()
    write_entry(spool, 0, n=256, k=0, digests=digests)
    write_entry(spool, 1, n=256, k=1, digests=digests, launch_index=1)  # a and b not copied: entry 0 has them
    write_entry(spool, 2, n=256, k=2, digests=digests, launch_index=2)
    real = spool_module.committed_entries
    listings = iter([[spool / "entries" / "00000001"]])

    def racing(spool_dir):  # the first listing misses entry 0 (and entry 2 is not there yet)
        return next(listings, None) or real(spool_dir)

    monkeypatch.setattr(spool_module, "committed_entries", racing)
    conv = converter(spool, out)
    assert conv.convert_ready() == 2  # entries 0 and 1, in order
    assert [e.seq for e in conv.stats.entries] == [0, 1]
    assert conv.convert_ready() == 1  # then entry 2
    assert len(RecordedExecution.from_json(database(out)).instances) == 3


def test_record_passes_the_output_and_exit_status_through_and_says_what_was_abandoned(tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(session, "recorder_library", lambda env: "libc.so.6")  # plumbing only: no GPU here
    app = fake_app(
        tmp_path,
        "from record_agent.testing import write_abandoned_entry\n"
        "assert os.environ['MNEME_RECORD_DEADLINE'] == '2.5'\n"
        "write_module(spool)\nwrite_entry(spool, 0)\n"
        f"write_abandoned_entry(spool, 1, {REASON!r}, k=1, launch_index=1)\n"
        "print('app output line')\nsys.exit(3)\n",
    )
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                                           "FLUX_TASK_RANK", "PMIX_RANK")}
    stats = tmp_path / "stats.json"
    env["MNEME_RECORD_STATS"] = str(stats)
    opts = RecordOptions(command=app, record_db_dir=str(tmp_path / "rdb"), deadline_s=2.5)
    summary = session.record(opts, env=env)
    out = capfd.readouterr()
    assert out.out == "app output line\n" and summary.exit_code == 3 and not summary.errors
    assert summary.instances == 2 and summary.deadline_abandoned == [(KERNEL, REASON)]
    assert "recorded 2 instance(s) of 1 kernel(s)" in out.err
    assert "1 instance(s) of 1 kernel(s) were abandoned at a deadline and written unsupported" in out.err
    assert REASON in out.err
    assert json.loads(stats.read_text())["abandoned"] == [{"kernel": KERNEL, "reason": REASON}]


def test_deadline_option(tmp_path):
    args = build_parser().parse_args(["record", "-rdb", "out", "--deadline", "0.5", "--", "./app"])
    assert args.deadline == 0.5
    assert build_parser().parse_args(["record", "-rdb", "out", "--", "./app"]).deadline == 5.0
    env = RecordOptions(command=("./app",), record_db_dir="d", deadline_s=0.5).recorder_environment("/s", None)
    assert env["MNEME_RECORD_DEADLINE"] == "0.5"
    assert RecordOptions(command=("./app",), record_db_dir="d").recorder_environment("/s", None)["MNEME_RECORD_DEADLINE"] == "5"
    with pytest.raises(Exception, match="--deadline"):
        RecordOptions(command=("./app",), record_db_dir="d", deadline_s=0)
