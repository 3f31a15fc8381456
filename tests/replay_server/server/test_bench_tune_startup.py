"""bench/tune_startup.py --engine test runs end to end without a GPU (fresh and reused setups, a compared
tree): its tables stay printable, and the reused setup really found the server left running."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_bench_prints_its_tables_with_the_test_engine(tmp_path):
    tree = tmp_path / "tree"  # this checkout's mneme as "another" tree: the compared column runs it from there
    for package in ("mneme", "replay_server", "tuner"):
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MNEME_CACHE_DIR": str(tmp_path / "user-cache")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "tune_startup.py"), "--engine", "test", "--repeats", "1",
         "--spaces", "launch", "--compare-tree", str(tree), "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "| **first verified result** |" in out and "| kept server found and probed |" in out
    assert "| configurations (verified/trials) | 13/13 | 13/13 | 13/13 |" in out
    for setup in ("launch, fresh | 1 |", "launch, reused | 1 |", "launch, fresh, compared tree | 1 |"):
        assert f"| {setup}" in out, out
    assert not (tmp_path / "user-cache").exists(), "the benchmark uses cache directories of its own"
