"""A real S3 server process (moto's server mode) on loopback, for the store tests and nothing else."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ACCESS_KEY = "mneme-test-key"
SECRET_KEY = "mneme-test-secret"


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


def s3_environment(endpoint: str, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> dict[str, str]:
    """Environment variables that point mneme (and child ``mneme`` processes) at ``endpoint``."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": access_key,
        "AWS_SECRET_ACCESS_KEY": secret_key,
        "AWS_REGION": "us-east-1",
        "MNEME_S3_CONFIG": os.devnull,
    }


def make_bucket(endpoint: str, name: str, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> None:
    from minio import Minio

    client = Minio(endpoint.split("://", 1)[1], access_key=access_key, secret_key=secret_key, secure=False,
                   region="us-east-1")
    client.make_bucket(name)
