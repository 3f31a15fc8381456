"""bench/tpe_efficiency.py keeps running (a short synthetic run; the full run is the benchmark)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "tpe_efficiency.py"


def test_tpe_benchmark_prints_its_table():
    proc = subprocess.run([sys.executable, str(BENCH), "--seeds", "2"], capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    assert "space: 405 configurations" in proc.stdout
    for row in ("tpe", "random", "TPE reaches within 5%"):
        assert row in proc.stdout
