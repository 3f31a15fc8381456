"""A real Ctrl-C (SIGINT), or SIGTERM (a batch system's time limit), to a running `mneme tune` leaves a
directory that --resume completes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mneme._internal.child_process import child_env

DRIVER = textwrap.dedent("""
    import sys
    import tuner.run
    from tuner.testing import FakeExecutor, vecadd_kernel
    from tuner.recording import KernelIdentity
    from mneme.cli import main

    tuner.run.default_executor = lambda options, d, ahead: FakeExecutor(workers=options.workers, delay={delay})
    tuner.run.load_instance = lambda db, rid: (vecadd_kernel(), KernelIdentity("vecAdd", "1", rid))
    sys.exit(main(["tune", "-rdb", "r.json", "-rid", "7", "--space-preset", "quick",
                   "--results-dir", {results!r}] + sys.argv[1:]))
""")


def driver(tmp_path: Path, delay: float) -> Path:
    path = tmp_path / f"driver_{int(delay * 1000)}.py"
    path.write_text(DRIVER.format(delay=delay, results=str(tmp_path / "run")))
    return path


@pytest.mark.parametrize("signum, status, said", [(signal.SIGINT, 130, "interrupted"),
                                                  (signal.SIGTERM, 143, "terminated (SIGTERM)")], ids=["sigint", "sigterm"])
def test_stopped_by_signal_then_resume(tmp_path, signum, status, said):
    proc = subprocess.Popen([sys.executable, str(driver(tmp_path, 0.02))], env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    trials = tmp_path / "run" / "trials.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not trials.exists() or trials.read_text().count("\n") < 5):
        time.sleep(0.02)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    assert "--resume" in err and f"mneme tune: {said}" in err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stopped"] == "interrupted" and 5 <= summary["trials"] < summary["space_size"]
    done = summary["trials"]

    proc = subprocess.run([sys.executable, str(driver(tmp_path, 0.0)), "--resume"], env=child_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    records = [json.loads(line) for line in trials.read_text().splitlines()]
    assert summary["complete"] and summary["skipped_resumed"] == done
    assert len(records) == len({r["hash"] for r in records}) == summary["space_size"] - summary["skipped_banned"]
