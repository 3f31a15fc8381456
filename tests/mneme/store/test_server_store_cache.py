"""Replay servers read remote recordings through the local chunk cache."""

from __future__ import annotations

from mneme.store import LocalStore
from mneme.store.transfer import push
from mneme.testing.store_recordings import write_recording
from replay_server.server import cuda_engine


def test_a_worker_loads_a_remote_recording_through_the_chunk_cache(tmp_path, s3_url, monkeypatch):
    monkeypatch.setenv("MNEME_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "rec"
    name = write_recording(source, instances=1)
    push(source, s3_url)
    cuda_engine._load_recording.cache_clear()

    recording = cuda_engine._load_recording(s3_url, name)
    instance = recording[next(iter(recording.instances))]
    regions = instance.load_prologue().regions
    assert [r.read(recording.store) for r in regions] == [r.read(LocalStore(source)) for r in regions]
    cached = list((tmp_path / "cache").rglob("*"))
    assert any(p.is_file() for p in cached), "chunks were not cached on the local disk"
    assert recording.store.misses > 0
