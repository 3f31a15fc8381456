"""The recorder's bounded waits without a GPU (native/recorder/src/deadlines.cpp, plain C++): the worker the
snapshots run on (a late job is left behind, the caller goes on at its deadline), the recording gate (launches
wait while another is recorded, give up at the owner's deadline, are waited for while inside the driver; two
recording threads take turns), and the deadline setting."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "native" / "recorder" / "src"


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    cxx = shutil.which("g++") or shutil.which("c++")
    if not cxx:
        pytest.skip("no C++ compiler")
    out = tmp_path_factory.mktemp("deadlines") / "deadlines_test"
    subprocess.run(
        [cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread", f"-I{SRC}",
         str(Path(__file__).with_name("deadlines_test.cpp")), str(SRC / "deadlines.cpp"), "-o", str(out)],
        check=True, capture_output=True, text=True,
    )
    return out


def test_worker_gate_and_deadline_settings(program):
    env = dict(os.environ, MNEME_RECORD_DEADLINE="0.4")
    env.pop("MNEME_RECORD_MAX_ABANDONED", None)
    proc = subprocess.run([str(program)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for case in ("settings", "worker", "gate_waits_for_the_owner", "gate_gives_up_on_a_late_owner",
                 "gate_drains_launches_inside_the_driver", "two_recorders_take_turns", "holders_count_once",
                 "away", "quiesce"):
        assert f"ok {case}" in lines, proc.stdout
    assert lines[-1] == "all ok"
