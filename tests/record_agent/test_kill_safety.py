"""A killed record agent leaves only whole objects, without any fsync (`mneme record`'s default durability).

The agent is killed (SIGKILL) in a child process in the middle of writing a
chunk (half its bytes in the temporary file) and just before it saves the
database. Every object that has its name in the recording directory is
whole (each chunk decompresses to bytes that hash to its name), no database
names anything missing, and recording again into the same directory gives
a recording that `mneme check --read-data` passes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

from mneme.format import RecorderInfo
from mneme.format.content_hash import digest_matches
from mneme.store import LocalStore
from mneme.store.check import check_store
from record_agent.convert import SpoolConverter
from record_agent.testing import write_entry, write_module

ROOT = Path(__file__).resolve().parents[2]
RECORDER = RecorderInfo("t", "host", None, "2026-01-01T00:00:00Z", ("app",))

AGENT = """
import os, signal, sys
import mneme.format.writer as writer
import mneme.store.local as local
from mneme.format import RecorderInfo
from mneme.store import LocalStore
from record_agent.convert import SpoolConverter

spool, out, where = sys.argv[1:4]
real_write_all, calls = local._write_all, [0]

def write_all(fd, parts):
    calls[0] += 1
    if where == "chunk" and calls[0] == 5:  # after the PTX, the cubin and two chunks: half on file, then killed
        data = b"".join(bytes(p) for p in parts)
        os.write(fd, data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    real_write_all(fd, parts)

local._write_all = write_all
if where == "database":
    writer.save_database = lambda store, db: os.kill(os.getpid(), signal.SIGKILL)
store = LocalStore(out, durability="none")
SpoolConverter(spool, store, executable=None, recorder=RecorderInfo("t", "host", None, "2026-01-01T00:00:00Z",
               ("app",))).convert_ready()
print("not killed")
"""


def _spool(path: Path) -> Path:
    write_module(path)
    write_entry(path, 0, n=1 << 20)  # three 4 MiB arrays: one chunk per array and phase
    return path


def _whole_objects(out: Path) -> list[str]:
    """The named (non-hidden) chunk files, each checked whole: zstd frame -> bytes that hash to the name."""
    names = []
    for f in sorted((out / "chunks").glob("*/*")):
        if f.name.startswith("."):
            continue
        data = zstandard.ZstdDecompressor().decompress(f.read_bytes(), max_output_size=64 << 20)
        assert digest_matches(data, f.name, "blake3"), f"{f} is not whole"
        names.append(f.name)
    return names


@pytest.mark.parametrize("where", ["chunk", "database"])
def test_a_killed_agent_leaves_only_whole_objects(tmp_path, where):
    spool, out = _spool(tmp_path / "spool"), tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", AGENT, str(spool), str(out), where], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert not list(out.glob("*.json"))  # the database comes last: none yet
    chunks = _whole_objects(out)
    if where == "chunk":
        # Killed at the fifth write, half-way through it: which objects came first depends on the agent's threads.
        assert len(chunks) < 4 and list(out.glob("chunks/*/.*.tmp"))  # the killed one's temporary file is hidden
    else:
        assert len(chunks) == 4 and list(out.glob("DeviceState.*"))  # every chunk and both snapshots, whole

    # Recording again into the same directory: a complete recording (the leftovers are not objects).
    store = LocalStore(out, durability="none")
    assert not [n for n in store.list() if "tmp" in n]
    SpoolConverter(_spool(tmp_path / "again"), store, executable=None, recorder=RECORDER).convert_ready()
    report = check_store(store, read_data=True)
    assert report.ok and len(report.recordings) == 1, report.lines()
