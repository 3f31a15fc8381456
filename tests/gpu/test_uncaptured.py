"""Launches that reach memory the recorder does not capture are recorded unsupported, with the reason, and refused.

tests/gpu/programs/uncaptured.cu: kernels on device memory, on managed memory,
on device memory that holds a pointer to managed memory and on a texture
object (all captured: they replay verified; the texture object is recreated),
and a kernel on mapped pinned host memory (refused).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_record import mneme_record, only_database, programs, recorder_lib  # noqa: F401 (fixtures)

from mneme.testing.gpu import child_env

pytestmark = pytest.mark.gpu

CAPTURED = ("scale_plain", "scale_managed", "follow_pointer", "read_texture")
EXPECTED = {
    "scale_host": "argument 0 points into pinned host memory mapped into the device",
}


def mneme(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mneme", *argv], env=child_env(), capture_output=True, text=True,
                          timeout=240)


@pytest.mark.parametrize("scope", ["all", "reachable"])
def test_uncaptured_memory_makes_launches_unsupported_and_replay_refuses_them(recorder_lib, programs, tmp_path, scope):
    rdb = tmp_path / "rdb"
    proc = mneme_record(recorder_lib, rdb, [programs / "uncaptured"], "--snapshot-scope", scope)
    assert "uncaptured: ok" in proc.stdout  # the application is unaffected

    # Managed memory, reached by an argument or through device memory, is captured; so is the texture object
    # (in reachable scope its buffer is reached from the object).
    for kernel in CAPTURED:
        rec = only_database(rdb, kernel)
        (inst,) = rec.instances.values()
        assert inst.supported, (kernel, inst.unsupported)
        replay = mneme("replay", "-rdb", str(rdb / rec.database_name), "--no-relocate")
        assert replay.returncode == 0 and '"verified": true' in replay.stdout, (kernel, replay.stdout, replay.stderr)

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
