"""Fixtures of the store tests: a real S3 server process (moto's server mode) on loopback.

Tests talk to it through the real minio client over HTTP, exactly as mneme
talks to MinIO or AWS. Each test gets its own bucket, so tests do not see
each other's objects.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

ACCESS_KEY = "mneme-test-key"
SECRET_KEY = "mneme-test-secret"
_bucket_numbers = itertools.count()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto_server(tmp: Path, port: int | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``python -m moto.server`` on loopback (a free port by default); return the process and its URL."""
    port = port or free_port()
    log = (tmp / f"moto-{port}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(endpoint + "/moto-api/data.json", timeout=1).read()
            return proc, endpoint
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"moto server did not start on {endpoint}; see {log.name}")
            time.sleep(0.1)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory) -> Iterator[str]:
    """The endpoint URL of one moto S3 server shared by the session's tests."""
    proc, endpoint = start_moto_server(tmp_path_factory.mktemp("moto"))
    yield endpoint
    stop(proc)


def s3_environment(endpoint: str, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> dict[str, str]:
    """Environment variables that point mneme (and child ``mneme`` processes) at ``endpoint``."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": access_key,
        "AWS_SECRET_ACCESS_KEY": secret_key,
        "AWS_REGION": "us-east-1",
        "MNEME_S3_CONFIG": os.devnull,
    }


@pytest.fixture
def s3_env(moto_endpoint, monkeypatch) -> dict[str, str]:
    env = s3_environment(moto_endpoint)
    for key in ("MNEME_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def make_bucket(endpoint: str, name: str, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> None:
    from minio import Minio

    client = Minio(endpoint.split("://", 1)[1], access_key=access_key, secret_key=secret_key, secure=False,
                   region="us-east-1")
    client.make_bucket(name)


@pytest.fixture
def s3_url(s3_env) -> str:
    """``s3://<fresh bucket>/recordings``, on the session's moto server."""
    bucket = f"mneme-test-{os.getpid()}-{next(_bucket_numbers)}"
    make_bucket(s3_env["AWS_ENDPOINT_URL"], bucket)
    return f"s3://{bucket}/recordings"
