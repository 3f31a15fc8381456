"""A real PostgreSQL server for the shared-study tests, started from Debian's ``postgresql`` package.

``initdb`` and ``postgres`` refuse to run as root: as root the cluster belongs to the ``postgres``
user (the package creates it) and the commands run through ``runuser``. Where the package, that user
or psycopg2 is missing, the tests skip and say which.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_url():
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        pytest.skip("psycopg2 is not installed (pip install psycopg2-binary, in mneme's test extra)")
    bin_dir = _bin_dir()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql; .ci/run does it)")
    prefix: list[str] = []
    owner = None
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and no 'postgres' user to own the test cluster")
        prefix = ["runuser", "-u", "postgres", "--"]
    root = Path(tempfile.mkdtemp(prefix="mneme-pg-"))
    if owner is not None:
        os.chown(root, owner.pw_uid, owner.pw_gid)
    data, port = root / "data", _free_port()

    def run(*command: str) -> None:
        subprocess.run(prefix + list(command), check=True, capture_output=True, timeout=120)

    run(str(bin_dir / "initdb"), "-D", str(data), "-U", "mneme", "-A", "trust", "--no-sync")
    log = root / "server.log"
    run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60", "start", "-o",
        f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200")
    try:
        run(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "mneme", "mneme")
        yield f"postgresql://mneme@127.0.0.1:{port}/mneme"
    finally:
        subprocess.run(prefix + [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                       capture_output=True, timeout=60)
        time.sleep(0.1)
        shutil.rmtree(root, ignore_errors=True)
