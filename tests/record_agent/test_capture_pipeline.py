"""The agent's capture pipeline (CPU): what it writes and in which order, what it times, and what the command
imports before the application starts."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

from mneme.format import RecorderInfo
from mneme.format.database import find_databases, load_database
from mneme.format.snapshot import MAGIC
from mneme.store import LocalStore
from record_agent.convert import SpoolConverter
from record_agent.testing import write_entry, write_module

ROOT = Path(__file__).resolve().parents[2]


class WatchedStore(LocalStore):
    """Notes, when the writer makes the recording durable, which spool stripe files still exist (plumbing only)."""

    def __init__(self, root, spool: Path):
        super().__init__(root, sync=False)
        self.spool = spool
        self.stripes_at_commit: list[list[str]] = []

    def make_durable(self, name=None) -> None:
        if name is None:
            self.stripes_at_commit.append(sorted(p.name for p in self.spool.glob("entries/*/*.bin")))
        super().make_durable(name)


def test_stripes_are_gone_before_the_commit_and_each_stage_is_timed(tmp_path):
    spool, out = tmp_path / "spool", tmp_path / "out"
    write_module(spool)
    write_entry(spool, 0, n=4096)
    store = WatchedStore(out, spool)
    conv = SpoolConverter(spool, store, executable=None, recorder=RecorderInfo("t", "host", None, "2026-01-01T00:00:00Z", ("app",)))
    assert conv.convert_ready() == 1
    # syncfs would otherwise write the spool's copy of the snapshot to disk too, where both share a file system.
    assert store.stripes_at_commit == [[]]
    (entry,) = conv.stats.entries
    p = entry.pipeline
    assert p.hashed_bytes + p.known_bytes == entry.snapshot_bytes and p.workers >= 1
    assert p.snapshot_s > 0 and p.commit_s > 0 and p.wall_s > 0
    rates = entry.as_dict()["rates"]
    assert rates["new_data_gb_s"] > 0 and rates["commit_gb_s"] > 0
    (name,) = find_databases(store)
    (inst,) = load_database(store, name).instances.values()
    header = store.get(inst.prologue.path)
    assert struct.unpack_from("<I", header, len(MAGIC))[0] == 2  # chunks named by BLAKE3


def test_the_command_starts_the_application_before_it_loads_the_conversion_machinery(tmp_path):
    """`mneme record`'s start-up: what it imports before the application's exec (a fresh interpreter; what
    the interpreter's site imported before the command starts does not count)."""
    probe = tmp_path / "modules_at_exec.txt"
    script = f"""
import sys
before = set(sys.modules)
import subprocess
import record_agent.session as session
heavy = ("record_agent.convert", "mneme.format.chunks", "mneme.format.database", "mneme.store.local", "zstandard",
         "blake3", "xxhash", "dataclasses", "inspect", "typing", "json", "pathlib", "tempfile", "shutil")
real = subprocess.Popen
def popen(*args, **kwargs):
    with open({str(probe)!r}, "w") as f:
        f.write(" ".join(m for m in heavy if m in sys.modules and m not in before))
    return real(*args, **kwargs)
session.subprocess.Popen = popen
from mneme.cli import main
sys.exit(main(["record", "-rdb", {str(tmp_path / "rdb")!r}, "--", sys.executable, "-c", "pass"]))
"""
    env = dict(os.environ, MNEME_RECORDER_LIB=sys.executable, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr  # nothing recorded: the application is not a CUDA program
    # Not the conversion machinery, and not dataclasses (with inspect), typing, json, pathlib, tempfile or shutil:
    # together about half of the command's own start-up on the development machine.
    assert probe.read_text().split() == []
