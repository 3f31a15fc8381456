"""`mneme record -rdb s3://...`: recorded into a local staging directory and
uploaded to a real S3 server process (moto's server mode) on loopback."""

from __future__ import annotations

import pytest
from test_session import env_without_ranks, fake_app

from mneme.recording.execution import RecordedExecution
from mneme.store import open_store
from mneme.testing.moto_s3 import make_bucket, s3_environment, start_moto_server, stop
from record_agent import session
from record_agent.options import RecordOptions


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    proc, url = start_moto_server(tmp_path_factory.mktemp("moto"))
    yield url
    stop(proc)


def test_record_into_s3(tmp_path, endpoint, monkeypatch):
    for key, value in s3_environment(endpoint).items():
        monkeypatch.setenv(key, value)
    for key in ("MNEME_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(session, "recorder_library", lambda env: "libc.so.6")
    make_bucket(endpoint, "rec-bucket")
    url = "s3://rec-bucket/runs/one"
    app = fake_app(tmp_path, "write_module(spool)\nwrite_entry(spool, 0)\nwrite_entry(spool, 1, k=1, launch_index=1)\n")
    env = dict(env_without_ranks(), **s3_environment(endpoint))
    summary = session.record(RecordOptions(command=app, record_db_dir=url), env=env)
    assert summary.exit_code == 0 and summary.instances == 2 and not summary.errors, (summary, summary.errors)
    store = open_store(url)
    (db,) = [n for n in store.list() if n.endswith(".json")]
    rec = RecordedExecution.from_json(f"{url}/{db}")
    assert len(rec.instances) == 2
    for inst in rec.instances.values():
        assert inst.load_epilogue().regions  # every named object arrived and verifies


def test_the_upload_spool_is_bounded_by_spool_max_bytes(monkeypatch, tmp_path):
    """The record agent hands its --spool-max-bytes to the uploader (back-pressure, not a full disk)."""
    import mneme.store.uploader as uploader
    from record_agent import session

    seen = {}

    class CapturingUploader:
        def __init__(self, staging_dir, destination, spool_limit=None, **kwargs):
            seen.update(staging_dir=staging_dir, destination=destination, spool_limit=spool_limit)

        def start(self):
            return self

    monkeypatch.setattr(uploader, "Uploader", CapturingUploader)
    session._start_uploader(str(tmp_path), "s3://bucket/prefix", 123 << 20)
    assert seen == {"staging_dir": str(tmp_path), "destination": "s3://bucket/prefix", "spool_limit": 123 << 20}
