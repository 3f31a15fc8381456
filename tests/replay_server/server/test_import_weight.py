"""What a worker imports on the way to its first replay: neither the S3 client, nor the record agent, nor numpy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _loaded_after(modules: str, watched: tuple[str, ...]) -> str:
    """Which of ``watched`` a fresh interpreter has loaded after importing ``modules`` (as printed)."""
    probe = f"import sys; import {modules}; print(sorted(m for m in {watched!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO)
    return done.stdout.strip() + done.stderr


def test_a_worker_on_a_local_store_does_not_import_the_s3_client():
    """The S3 client (minio and urllib3: ~0.3 s) is imported only by those who talk to S3; a worker
    restoring a recording from a directory reaches its first replay without it."""
    modules = ("replay_server.server.worker, replay_server.server.cuda_engine, mneme.replay.replayer, "
               "mneme.store.cache, mneme.store.transfer, mneme.store.uploader, mneme.recording.execution")
    assert _loaded_after(modules, ("minio", "urllib3")) == "[]"


def test_a_worker_reaches_its_first_replay_without_the_record_agent_or_numpy():
    """A worker's imports are on the critical path of `mneme tune`'s first result: its start, the first
    context's window reservation (mneme.replay.placement, mneme.recording.window) and the replay stack it
    warms up (EngineSpec.warm_up) import neither the record agent nor numpy; numpy comes in only where a
    replay scans snapshots for pointers (relocation, globals)."""
    modules = ("replay_server.server.worker, replay_server.server.cuda_engine, mneme.replay.engine, "
               "mneme.replay.selftest, mneme.replay.placement, mneme.recording.window, mneme._internal.devices, "
               "mneme.replay.replayer, mneme.recording.execution, mneme.replay.tolerance")
    assert _loaded_after(modules, ("record_agent", "numpy")) == "[]"
