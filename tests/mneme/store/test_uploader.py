"""The record agent's Uploader: incremental uploads while recording, bounded spool, survives a dead network."""

from __future__ import annotations

import threading

import pytest

from mneme.errors import MnemeError
from mneme.store import open_store
from mneme.store.config import S3Settings
from mneme.store.retry import RetryPolicy
from mneme.store.s3 import S3Store
from mneme.store.transfer import pull
from mneme.store.uploader import Uploader, spool_bytes
from mneme.testing.moto_s3 import (
    ACCESS_KEY,
    SECRET_KEY,
    free_port,
    make_bucket,
    start_moto_server,
    stop,
)
from mneme.testing.store_recordings import tree, write_recording

FAST_RETRY = RetryPolicy(attempts=2, initial_delay_s=0.05, max_delay_s=0.1)


def test_uploads_recordings_as_they_are_committed(tmp_path, s3_url):
    staging, reference = tmp_path / "staging", tmp_path / "reference"
    with Uploader(staging, s3_url, poll_interval_s=0.1, retry=FAST_RETRY) as uploader:
        for count in (1, 2, 3):  # the application keeps launching the kernel
            name = write_recording(staging, instances=count)
            uploader.notify()
        write_recording(staging, kernel="second_kernel", instances=2, seed=3)
        uploader.notify()
    expected = {write_recording(reference, instances=3),
                write_recording(reference, kernel="second_kernel", instances=2, seed=3)}
    assert set(uploader.total.committed) == expected and name in expected
    pull(s3_url, tmp_path / "pulled")
    assert tree(tmp_path / "pulled") == tree(reference)
    assert list(open_store(staging).list("chunks/")) == [], "uploaded chunks were pruned from the spool"


def test_spool_limit_applies_back_pressure_until_the_store_comes_back(tmp_path):
    """The HPC case: no network at first; the producer waits instead of filling the disk; then all is uploaded."""
    port = free_port()
    settings = S3Settings(endpoint=f"http://127.0.0.1:{port}", access_key_id=ACCESS_KEY,
                          secret_access_key=SECRET_KEY, region="us-east-1", source="test")
    destination = S3Store("s3://spool-bucket/recordings", settings)
    staging, reference = tmp_path / "staging", tmp_path / "reference"
    uploader = Uploader(staging, destination, spool_limit=64 << 10, poll_interval_s=0.05, retry=FAST_RETRY,
                        retry_pass_max_s=0.2).start()
    name = write_recording(staging, instances=2)
    uploader.notify()
    assert spool_bytes(staging) > 64 << 10
    assert uploader.wait_for_space(timeout=1.0) is False, "no network: the producer is held back"
    assert uploader.last_error is not None and "cannot reach S3" in str(uploader.last_error)

    proc, endpoint = start_moto_server(tmp_path, port)
    try:
        make_bucket(endpoint, "spool-bucket")
        assert uploader.wait_for_space(timeout=60) is True
        assert spool_bytes(staging) <= 64 << 10
        report = uploader.close(timeout=60)
        assert report.committed == [name]
        write_recording(reference, instances=2)
        pull(destination, tmp_path / "pulled")
        assert tree(tmp_path / "pulled") == tree(reference)
    finally:
        stop(proc)


def test_staging_directory_may_appear_later(tmp_path, s3_url):
    staging = tmp_path / "not-yet"
    uploader = Uploader(staging, s3_url, poll_interval_s=0.05, retry=FAST_RETRY).start()
    uploader.notify()
    name = write_recording(staging, instances=1)
    assert uploader.close(timeout=30).committed == [name]


def test_a_permanent_error_stops_the_uploader_and_says_how_to_finish(tmp_path, s3_env):
    uploader = Uploader(tmp_path / "staging", "s3://no-such-bucket-anywhere/x", poll_interval_s=0.05,
                        retry=FAST_RETRY).start()
    write_recording(tmp_path / "staging", instances=1)
    uploader.notify()
    with pytest.raises(MnemeError, match="push --resume"):
        uploader.close(timeout=30)


def test_producer_waits_on_a_thread_while_the_uploader_drains(tmp_path, s3_url):
    staging = tmp_path / "staging"
    uploader = Uploader(staging, s3_url, spool_limit=1, poll_interval_s=0.05, retry=FAST_RETRY).start()
    done = threading.Event()

    def producer():
        for count in (1, 2):
            write_recording(staging, instances=count)
            uploader.notify()
            assert uploader.wait_for_space(timeout=60)
        done.set()

    thread = threading.Thread(target=producer)
    thread.start()
    thread.join(60)
    assert done.is_set()
    uploader.close(timeout=60)
    assert list(open_store(staging).list("chunks/")) == []
