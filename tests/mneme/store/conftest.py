"""Fixtures of the store tests: a real S3 server process (moto's server mode) on loopback.

Tests talk to it through the real minio client over HTTP, exactly as mneme
talks to MinIO or AWS. Each test gets its own bucket, so tests do not see
each other's objects.
"""

from __future__ import annotations

import itertools
import os
from typing import Iterator

import pytest

from mneme.testing.moto_s3 import make_bucket, s3_environment, start_moto_server, stop

_bucket_numbers = itertools.count()


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory) -> Iterator[str]:
    """The endpoint URL of one moto S3 server shared by the session's tests."""
    proc, endpoint = start_moto_server(tmp_path_factory.mktemp("moto"))
    yield endpoint
    stop(proc)


@pytest.fixture
def s3_env(moto_endpoint, monkeypatch) -> dict[str, str]:
    env = s3_environment(moto_endpoint)
    for key in ("MNEME_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@pytest.fixture
def s3_url(s3_env) -> str:
    """``s3://<fresh bucket>/recordings``, on the session's moto server."""
    bucket = f"mneme-test-{os.getpid()}-{next(_bucket_numbers)}"
    make_bucket(s3_env["AWS_ENDPOINT_URL"], bucket)
    return f"s3://{bucket}/recordings"
