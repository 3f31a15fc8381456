"""Launches that reach memory the recorder does not capture are recorded unsupported, with the reason, and refused.

tests/gpu/programs/uncaptured.cu: one kernel on device memory (replays), and
kernels on managed memory, on mapped pinned host memory, on a texture object,
and on device memory that holds a pointer to managed memory.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from gpu_env import child_env
from test_record import mneme_record, only_database, programs, recorder_lib  # noqa: F401 (fixtures)

pytestmark = pytest.mark.gpu

EXPECTED = {
    "scale_managed": "argument 0 points into managed memory (cudaMallocManaged)",
    "scale_host": "argument 0 points into pinned host memory mapped into the device",
    "read_texture": "the kernel reads texture objects",
    "follow_pointer": "holds a pointer into managed memory (cudaMallocManaged)",
}


def mneme(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mneme", *argv], env=child_env(), capture_output=True, text=True,
                          timeout=240)


@pytest.mark.parametrize("scope", ["all", "reachable"])
def test_uncaptured_memory_makes_launches_unsupported_and_replay_refuses_them(recorder_lib, programs, tmp_path, scope):
    rdb = tmp_path / "rdb"
    proc = mneme_record(recorder_lib, rdb, [programs / "uncaptured"], "--snapshot-scope", scope)
    assert "uncaptured: ok" in proc.stdout  # the application is unaffected

    plain = only_database(rdb, "scale_plain")
    (inst,) = plain.instances.values()
    assert inst.supported, inst.unsupported
    replay = mneme("replay", "-rdb", str(rdb / plain.database_name))
    assert replay.returncode == 0 and '"verified": true' in replay.stdout, replay.stderr

    for kernel, reason in EXPECTED.items():
        rec = only_database(rdb, kernel)
        (inst,) = rec.instances.values()
        assert not inst.supported and any(reason in r for r in inst.unsupported), (kernel, inst.unsupported)
        refused = mneme("replay", "-rdb", str(rdb / rec.database_name))
        assert refused.returncode == 2, (kernel, refused.stdout, refused.stderr)
        assert reason in refused.stderr and "CUDA_ERROR" not in refused.stderr
        tuned = mneme("tune", "-rdb", str(rdb / rec.database_name), "--space-preset", "launch", "--launch-dim", "x",
                      "--sampler", "exhaustive", "-rid", inst.record_id, "--results-dir", str(tmp_path / kernel))
        assert tuned.returncode == 2 and reason in tuned.stderr, (kernel, tuned.stderr)

    listing = mneme("ls", str(rdb))
    assert listing.returncode == 0 and f"({len(EXPECTED)} unsupported" in " ".join(listing.stdout.split())
