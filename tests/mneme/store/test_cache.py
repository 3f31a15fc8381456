"""The replay servers' chunk cache in front of S3: verified fills, hits without the network, LRU bound."""

from __future__ import annotations

import os
import time

import pytest

from mneme.errors import ArtifactError
from mneme.recording.execution import RecordedExecution
from mneme.store import LocalStore, open_store
from mneme.store.cache import CachedStore, cached_store
from mneme.store.transfer import push
from mneme.testing.store_recordings import write_recording


def test_instances_read_through_the_cache_equal_the_local_recording(tmp_path, s3_url):
    source = tmp_path / "rec"
    name = write_recording(source, instances=2)
    push(source, s3_url)
    local = RecordedExecution.from_store(LocalStore(source), name)
    store = cached_store(s3_url, tmp_path / "cache")
    assert isinstance(store, CachedStore) and store.url == s3_url
    remote = RecordedExecution.from_store(store, name)
    for record_id in local.instances:
        for load in ("load_prologue", "load_epilogue"):
            mine, theirs = getattr(local[record_id], load)(), getattr(remote[record_id], load)()
            for a, b in zip(mine.regions, theirs.regions):
                assert a.read(LocalStore(source)) == b.read(store)
    assert store.misses > 0 and store.hits > 0, "shared chunks are fetched once"
    fetched = store.misses
    # A second server process on the machine: everything comes from the disk cache.
    again = cached_store(s3_url, tmp_path / "cache")
    for record_id in local.instances:
        for region in RecordedExecution.from_store(again, name)[record_id].load_prologue().regions:
            region.read(again)
    assert again.misses == 0 and again.hits > 0 and fetched == store.misses


def test_cached_chunks_survive_the_remote_going_away(tmp_path, s3_url):
    source = tmp_path / "rec"
    name = write_recording(source, instances=1)
    push(source, s3_url)
    store = cached_store(s3_url, tmp_path / "cache")
    recording = RecordedExecution.from_store(store, name)
    snapshot = recording[next(iter(recording.instances))].load_prologue()
    expected = [r.read(store) for r in snapshot.regions]
    remote = open_store(s3_url)
    for chunk in list(remote.list("chunks/")):
        remote.delete(chunk)
    assert [r.read(store) for r in snapshot.regions] == expected
    assert store.local_path(snapshot.regions[0].chunks[0].name).is_file()


def test_a_corrupt_remote_chunk_is_never_cached(tmp_path, s3_url):
    source = tmp_path / "rec"
    write_recording(source, instances=1)
    push(source, s3_url)
    remote = open_store(s3_url)
    victim = next(iter(remote.list("chunks/")))
    remote.put(victim, b"\x28\xb5\x2f\xfd garbage")
    store = cached_store(s3_url, tmp_path / "cache")
    with pytest.raises(ArtifactError, match="corrupt.*not cached"):
        store.get(victim)
    assert store.local_path(victim) is None and not (tmp_path / "cache" / victim).exists()


def test_size_bound_evicts_least_recently_used(tmp_path, s3_url):
    source = tmp_path / "rec"
    write_recording(source, instances=1, buffer_bytes=64 << 10, chunk_size=4 << 10, changed_fraction=1.0)
    push(source, s3_url)
    remote = open_store(s3_url)
    chunks = list(remote.list("chunks/"))
    sizes = {c: remote.size(c) for c in chunks}
    bound = sum(sizes.values()) // 3
    store = CachedStore(remote, tmp_path / "cache", max_bytes=bound)
    first = chunks[0]
    store.get(first)
    old = time.time() - 3600
    os.utime(store.local_path(first), (old, old))
    for chunk in chunks[1:]:
        store.get(chunk)
    assert store.cached_bytes() <= bound
    assert store.local_path(first) is None, "the least recently used chunk went first"
    assert store.local_path(chunks[-1]) is not None


def test_local_directories_are_not_cached(tmp_path):
    assert isinstance(cached_store(tmp_path, tmp_path / "cache"), LocalStore)


def test_names_are_validated_before_the_cache_is_touched(tmp_path, s3_url):
    store = cached_store(s3_url, tmp_path / "cache")
    for bad in ("../x", "chunks/../../etc/passwd", "/abs"):
        with pytest.raises(ArtifactError):
            store.get(bad)
