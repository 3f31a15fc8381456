"""push/pull/copy/move/clean/gc/ls between directories and a real S3 server (moto) over HTTP."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from mneme.errors import ArtifactError
from mneme.format.database import load_database
from mneme.format.snapshot import read_snapshot
from mneme.recording.execution import RecordedExecution
from mneme.store import LocalStore, open_store
from mneme.store.cleanup import clean, gc
from mneme.store.contents import database_names
from mneme.store.retry import RetryPolicy, with_retries
from mneme.store.s3 import StoreUnavailableError
from mneme.store.summary import summarize
from mneme.store.transfer import move, pull, push
from mneme.testing.store_recordings import tree, write_recording

VECADD = Path(__file__).resolve().parents[2] / "data" / "recordings" / "vecadd"


def test_push_pull_round_trip_is_byte_exact(tmp_path, s3_url):
    source = tmp_path / "synthetic"
    write_recording(source, instances=3)
    write_recording(source, kernel="other_kernel", instances=2, seed=1)
    report = push(source, s3_url, progress=True)  # the rich bar too, on stderr
    assert sorted(report.committed) == sorted(database_names(LocalStore(source)))
    assert report.chunks_copied > 0 and report.bytes_copied > 0
    pull(s3_url, tmp_path / "pulled")
    assert tree(tmp_path / "pulled") == tree(source)


def test_recorded_vecadd_round_trip_is_byte_exact_and_replayable_from_s3(tmp_path, s3_url):
    if not any(VECADD.glob("*.json")):
        pytest.skip(f"{VECADD} holds no recording")
    push(VECADD, s3_url)
    pull(s3_url, tmp_path / "pulled")
    assert tree(tmp_path / "pulled") == tree(VECADD)
    (name,) = database_names(LocalStore(VECADD))
    recording = RecordedExecution.from_json(f"{s3_url}/{name}")  # s3:// wherever a recording path goes
    local = RecordedExecution.from_json(str(VECADD / name))
    for record_id in local.instances:
        mine, theirs = local[record_id].load_prologue(), recording[record_id].load_prologue()
        assert [r.read(local.store) for r in mine.regions] == [r.read(recording.store) for r in theirs.regions]


def test_pushing_again_sends_nothing_and_new_instances_only_send_new_chunks(tmp_path, s3_url):
    source = tmp_path / "rec"
    write_recording(source, instances=2)
    first = push(source, s3_url)
    again = push(source, s3_url)
    assert again.unchanged == first.committed and again.chunks_copied == 0 and again.bytes_copied == 0
    write_recording(source, instances=4)  # same kernel, two more launches (same data for the first two)
    grown = push(source, s3_url, resume=True)
    assert grown.committed == first.committed
    assert 0 < grown.chunks_copied < first.chunks_copied + grown.chunks_present
    assert grown.chunks_present > 0, "chunks already uploaded are not sent again"
    db = load_database(open_store(s3_url), first.committed[0])
    assert len(db.instances) == 4


def test_chunks_are_shared_across_jobs_in_one_bucket(tmp_path, s3_url):
    one, two = tmp_path / "job1", tmp_path / "job2"
    write_recording(one, instances=2)
    write_recording(two, kernel="same_data_other_kernel", instances=2)  # same seed: same buffers
    push(one, s3_url)
    report = push(two, s3_url)
    assert report.chunks_copied == 0 and report.chunks_present > 0


def test_merge_keeps_instances_from_both_sides(tmp_path, s3_url):
    one, two = tmp_path / "rank0", tmp_path / "rank1"
    name = write_recording(one, instances=2)
    write_recording(two, instances=3, seed=5, buffer_bytes=128 << 10)  # other launch arguments
    push(one, s3_url)
    push(two, s3_url)
    merged = load_database(open_store(s3_url), name)
    assert len(merged.instances) == 2 + 3
    pulled = tmp_path / "pulled"
    pull(s3_url, pulled)
    RecordedExecution.from_json(str(pulled / name))  # the merged recording reads back


def test_dedupe_ratio_on_repeated_instances(tmp_path, s3_url):
    source = tmp_path / "rec"
    write_recording(source, instances=8, buffer_bytes=256 << 10, chunk_size=16 << 10, changed_fraction=0.05)
    push(source, s3_url)
    summary = summarize(s3_url)
    (recording,) = summary.recordings
    assert len(recording.instances) == 8
    assert recording.logical_bytes == 8 * 2 * 2 * (256 << 10)  # instances x (prologue, epilogue) x 2 buffers
    # Random data does not compress: the ratio is the deduplication across instances and phases.
    assert summary.dedupe_ratio > 10, summary
    assert summary.stored_chunk_bytes == sum(
        info.size for info in open_store(s3_url).list_info("chunks/"))
    local = summarize(source)
    assert local.dedupe_ratio == pytest.approx(summary.dedupe_ratio, rel=1e-9)


def test_corrupted_chunk_is_detected_on_read_and_not_copied(tmp_path, s3_url):
    source = tmp_path / "rec"
    name = write_recording(source, instances=1)
    push(source, s3_url)
    store = open_store(s3_url)
    db = load_database(store, name)
    instance = next(iter(db.instances.values()))
    region = read_snapshot(store, instance.prologue.path).regions[0]
    victim = region.chunks[0].name
    blob = bytearray(store.get(victim))
    blob[len(blob) // 2] ^= 0xFF
    store.put(victim, bytes(blob))
    with pytest.raises(ArtifactError, match=f"{victim}.*corrupt"):
        region.read(store)
    with pytest.raises(ArtifactError, match="corrupt"):
        pull(s3_url, tmp_path / "pulled")
    assert not (tmp_path / "pulled" / name).exists(), "no database is written when its chunks are bad"


def test_corrupt_source_file_is_not_uploaded(tmp_path, s3_url):
    source = tmp_path / "rec"
    name = write_recording(source, instances=1)
    manifest = next(source.glob("DeviceState.epilogue.*"))
    manifest.write_bytes(manifest.read_bytes()[:-3])
    with pytest.raises(ArtifactError, match="snapshot"):
        push(source, s3_url)
    assert not open_store(s3_url).exists(name)


def test_clean_and_gc_remove_only_what_nothing_references(tmp_path, s3_url):
    source = tmp_path / "rec"
    keep = write_recording(source, instances=2)
    drop = write_recording(source, kernel="dropped", instances=2, seed=9)
    push(source, s3_url)
    store = open_store(s3_url)
    before = set(store.list())
    report = clean(store, [drop.removesuffix(".json")], grace_s=3600)
    assert report.databases == [drop] and report.objects == 6  # 2 prologues, 2 epilogues, PTX, cubin
    assert report.chunks == 0 and report.kept_young > 0, "fresh chunks survive the grace period"
    assert gc(store, grace_s=0, dry_run=True).chunks == report.kept_young
    collected = gc(store, grace_s=0)
    assert collected.chunks > 0 and collected.bytes > 0
    assert gc(store, grace_s=0).chunks == 0
    pulled = tmp_path / "pulled"
    pull(store, pulled)
    assert database_names(LocalStore(pulled)) == [keep]
    assert set(store.list()) < before
    RecordedExecution.from_json(str(pulled / keep))


def test_gc_refuses_when_a_database_is_unreadable(tmp_path):
    store = LocalStore(tmp_path / "rec")
    name = write_recording(store.root, instances=1)
    store.put(name, b"{ not json")
    with pytest.raises(ArtifactError, match="nothing was deleted"):
        gc(store, grace_s=0)


def test_gc_keeps_chunks_a_concurrent_upload_reuses(tmp_path):
    """An old unreferenced chunk that an upload reuses is refreshed and survives gc."""
    dst = LocalStore(tmp_path / "dst")
    source = tmp_path / "src"
    name = write_recording(source, instances=1)
    push(source, dst)
    clean(dst, collect_chunks=False)  # the recording is gone, its chunks are unreferenced ...
    old = time.time() - 7200
    for chunk in dst.list("chunks/"):
        os.utime(dst.local_path(chunk), (old, old))  # ... and two hours old
    push(source, dst)  # reuses every chunk: they are refreshed
    assert gc(dst, grace_s=3600).chunks == 0
    RecordedExecution.from_json(str(dst.root / name))


def test_move_between_directory_and_s3(tmp_path, s3_url):
    source = tmp_path / "rec"
    name = write_recording(source, instances=2)
    original = tree(source)
    moved, cleaned = move(source, s3_url, grace_s=0)
    assert moved.committed == [name] and cleaned.databases == [name]
    assert database_names(LocalStore(source)) == [] and list(LocalStore(source).list("chunks/")) == []
    back = tmp_path / "back"
    move(s3_url, back, grace_s=0)
    assert tree(back) == original
    assert list(open_store(s3_url).list()) == []


def test_unknown_recording_is_a_clear_error(tmp_path, s3_url):
    with pytest.raises(ArtifactError, match="no recording 123 in .*mneme ls"):
        push(tmp_path, s3_url, recordings=["123"])


def test_retries_transient_errors_with_backoff():
    calls, sleeps = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise StoreUnavailableError("down")
        return "ok"

    assert with_retries(flaky, RetryPolicy(attempts=5, initial_delay_s=1), sleeps.append) == "ok"
    assert len(sleeps) == 2 and sleeps[1] > sleeps[0]
    with pytest.raises(StoreUnavailableError):
        with_retries(lambda: (_ for _ in ()).throw(StoreUnavailableError("down")), RetryPolicy(attempts=3),
                     sleeps.append)
