"""Whole-recording verification and the live-object set used by garbage collection."""

import pytest

from mneme.errors import ArtifactError
from mneme.format.database import find_databases, load_database
from mneme.format.snapshot import read_snapshot
from mneme.format.verify import live_objects, recording_objects, verify_recording
from mneme.testing.synthetic import write_vecadd_recording


@pytest.fixture
def recording(tmp_path):
    return write_vecadd_recording(tmp_path, n=2000, instances=2, chunk_size=1024)


def test_intact_recording_verifies(recording):
    report = verify_recording(recording.store, recording.database)
    assert report.ok, report.problems
    assert report.objects_checked == 2 + 4
    assert report.chunks_checked > 0 and report.bytes_checked > 0
    report.raise_for_problems()


def test_every_problem_is_reported(recording):
    store = recording.store
    db = load_database(store, recording.database)
    inst = db.instances[recording.dynamic_hash]
    snapshot = read_snapshot(store, inst.epilogue.path)
    chunk = snapshot.region_named("c").chunks[0]
    store.delete(chunk.name)
    cubin = db.code.cubin.path
    store.put(cubin, store.get(cubin)[:-1] + b"\x01")
    store.delete(inst.prologue.path)
    report = verify_recording(store, recording.database)
    text = "\n".join(report.problems)
    assert f"chunk {chunk.name} is missing" in text
    assert f"{cubin} does not match its SHA-256" in text
    assert f"{inst.prologue.path} is missing" in text
    with pytest.raises(ArtifactError, match="3 problem"):
        report.raise_for_problems()
    shallow = verify_recording(store, recording.database, deep=False)
    assert len(shallow.problems) == 2  # the cubin keeps its size


def test_unreadable_database_is_a_problem(tmp_path):
    report = verify_recording(write_vecadd_recording(tmp_path).store, "1.json")
    assert not report.ok and "1.json not found" in report.problems[0]


def test_live_objects_cover_exactly_the_recordings(tmp_path):
    r1 = write_vecadd_recording(tmp_path, n=300, seed=1)
    r2 = write_vecadd_recording(tmp_path, n=300, seed=2, include_ptx=False)
    assert find_databases(r1.store) == sorted({r1.database, r2.database})
    live = live_objects(r1.store)
    assert live == set(r1.store.list())
    r1.store.put("chunks/00/" + "0" * 64, b"orphan")
    assert "chunks/00/" + "0" * 64 not in live_objects(r1.store)
    one = recording_objects(r1.store, load_database(r1.store, r1.database))
    assert r1.database in one and r2.database not in one
