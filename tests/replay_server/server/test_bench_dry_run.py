"""bench/server_throughput.py runs end to end (test engine, no GPU, two servers): its tables stay printable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from replay_server.testing.servers import subprocess_env

ROOT = Path(__file__).resolve().parents[3]


def test_bench_prints_its_table(tmp_path):
    env = subprocess_env(tmp_path / "log")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "server_throughput.py"), "--n", "4096", "--gpus", "2",
         "--modes", "concurrent", "--workers-per-gpu", "1", "--repeats", "1", "--warm-passes", "1", "--timeline", "--transports", "stream,unary",
         "--engine", "replay_server.testing.fake_engine:spec_from_env",
         "--engine-env", json.dumps(env)],
        capture_output=True, text=True, timeout=120, env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| reference (Mneme/HIP, 1 GPU)" in done.stdout and "11.3" in done.stdout
    assert "| mneme, 1 GPU, concurrent" in done.stdout and "80/80" in done.stdout
    for transport in ("stream", "unary", "stream, compiled ahead", "unary, compiled ahead"):
        assert f"| mneme, 2 GPUs, concurrent, {transport}" in done.stdout
        assert f"| concurrent, cold, {transport}" in done.stdout
        assert f"| concurrent, cold after compiles, {transport}" in done.stdout
    timeline = [line for line in done.stdout.splitlines() if line.startswith("timeline 2 GPU concurrent stream run 0: ")]
    assert timeline, done.stdout
    first = json.loads(timeline[0].split(": ", 1)[1])["first_result_ms"]
    assert set(first) == {"O0", "O1", "O2", "O3", "O4"}  # every compile variant's first result arrived
    assert "80 configs, code compiled by Prepare" in done.stdout and "code compiled ahead" in done.stdout
