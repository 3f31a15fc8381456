"""bench/sweep_pace.py runs end to end without a GPU (the real replayer, servers and compile pool over the
fake native engine): its table keeps its rows and columns, and its result file its section."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_bench_prints_its_rows_beside_the_floor(tmp_path):
    results = tmp_path / "sweep_pace.md"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "MNEME_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sweep_pace.py"), "--engine", "test", "--configs", "12",
         "--rows", "launch,small,compile", "--n", "4096", "--small-n", "2048", "--test-kernel-us", "50",
         "--results-file", str(results)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert ("| row | tree | configs | verified | s | configs/s | kernel us | mean us | floor/s | GPU busy "
            "| replay floor/s | % of replay floor |") in out
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in out.splitlines() if line.startswith("| ") and "this tree" in line}
    assert set(rows) == {"launch", "small", "compile"}, out
    launch = rows["launch"]
    assert launch[3] == "32/32"  # 32 block sizes at least, every one verified
    assert launch[6] == launch[7] == "50.0" and launch[8] == str(round(1e9 / (7 * 50_000)))  # median, mean, floor
    assert 0.5 < float(launch[10]) / float(launch[8]) < 1.1  # the replay floor: about the kernels' floor here
    assert rows["compile"][12] != "-"  # compile ms per variant
    assert "the compile pool, " in out
    assert "GPU busy (target >= 80%" in out
    text = results.read_text()
    assert "## test engine (no GPU), 1 worker(s)" in text and "| launch | this tree |" in text
