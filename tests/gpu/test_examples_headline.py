"""The headline benchmark end to end on the GPU, on a small scale: one cheap
workload recorded once, replayed and tuned, every output written.

The full run (`python bench/headline.py --out DIR`) is the benchmark itself;
this only proves the one command works on the GPU machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_headline_measures_the_cg_solver(tmp_path):
    out = tmp_path / "headline"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "headline.py"), "--out", str(out), "--workloads", "minife_cg",
         "--repeats", "1", "--fidelity-iterations", "5"],
        capture_output=True, text=True, timeout=1200,
    )
    assert (out / "headline.json").is_file(), proc.stdout + proc.stderr
    results = json.loads((out / "headline.json").read_text())
    cg = results["workloads"]["minife_cg"]
    assert "error" not in cg["recording"], cg["recording"]
    assert cg["recording"]["recorded_median_s"] > 0 and cg["recording"]["record_bytes"] > 0
    assert "error" not in cg["fidelity"], cg["fidelity"]
    assert cg["fidelity"]["verified"], cg["fidelity"]
    assert 0.5 < cg["fidelity"]["ratio"] < 2.0  # the same kernel: the loose bound only catches a broken timer
    tuning = results["tuning"]["minife_cg"]
    assert "error" not in tuning, tuning
    # The spmv space (160 points) repeated to the sweep's length (--tune-min-configs, default 1000).
    assert tuning["configurations"] >= 1000 and tuning["configurations"] % 160 == 0, tuning
    assert tuning["verified"] > 0
    assert tuning["best"]["speedup"] > 0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = (out / "headline.md").read_text()
    assert "minife_cg" in table and "1.26 observations/s" in table
