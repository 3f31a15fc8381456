"""bench/client_capacity.py runs end to end on loopback (test engine): its tables stay printable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_prints_the_curve_and_the_shared_study(tmp_path):
    results = tmp_path / "capacity.md"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "client_capacity.py"), "--mode", "all", "--servers", "1,2",
         "--seconds", "0.5", "--settle", "0.2", "--trials", "40", "--workers", "1", "--results-file", str(results)],
        capture_output=True, text=True, timeout=240, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| executor |", "| tuner |"))]
    assert len(rows) == 4, done.stdout
    assert all(float(row.split("|")[3]) > 0 for row in rows)
    assert "target >= 10000/s at 2 servers, executor" in done.stdout
    assert "| 1 |" in done.stdout and "| 2 |" in done.stdout and "2 processes / 1:" in done.stdout
    assert "shared study (study-server, 2 front processes)" in done.stdout  # the default: mneme study-server
    shared = [line.split("|") for line in done.stdout.splitlines() if line.startswith(("| 1 |", "| 2 |"))]
    assert [row[5].strip() for row in shared] == ["0", "0"], "no configuration evaluated twice"
    # each tuner runs the same settings in every row (half the servers' capacity split among the most tuners)
    assert len({row[6].strip() for row in shared}) == 1, shared
    assert all(row[13].strip().endswith("%") for row in shared), "the machine's CPU busy"
    assert "2 processes: their trials from/to" in done.stdout
    text = results.read_text()
    assert "* commit: " in text and "CPUs" in text and "2 processes / 1:" in text


def test_bench_measures_the_tuning_loop_alone():
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "client_capacity.py"), "--mode", "loop", "--seconds", "0.5",
         "--settle", "0.2"],
        capture_output=True, text=True, timeout=240, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = [line for line in done.stdout.splitlines() if line.startswith("| loop |")]
    assert float(row.split("|")[2]) > 0 and row.split("|")[5].strip().endswith("us")


def test_bench_says_what_a_tuners_configurations_in_flight_can_be():
    import importlib.util

    spec = importlib.util.spec_from_file_location("client_capacity", ROOT / "bench" / "client_capacity.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    same = bench.tuner_in_flight("same", 2, 16, [1, 2, 4])
    split = bench.tuner_in_flight("split", 2, 16, [1, 2, 4])
    assert same(1) == same(4) == split(4) and split(1) == 4 * split(4)
    assert bench.tuner_in_flight("100", 2, 16, [1])(1) == 100
    for bad in ("0", "many"):
        try:
            bench.tuner_in_flight(bad, 2, 16, [1])
        except SystemExit as exc:
            assert "--tuner-in-flight" in str(exc)
        else:
            raise AssertionError(bad)


def test_bench_runs_each_tuner_on_a_study_of_its_own():
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "client_capacity.py"), "--mode", "shared-study", "--echo-servers",
         "--servers", "2", "--tuners", "1,2", "--trials", "30", "--own-studies", "--results-file", ""],
        capture_output=True, text=True, timeout=240, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "a study per tuner" in done.stdout
    rows = [line.split("|") for line in done.stdout.splitlines() if line.startswith(("| 1 |", "| 2 |"))]
    assert [row[4].strip() for row in rows] == ["30 (30)", "60 (30, 30)"], rows
    assert [row[5].strip() for row in rows] == ["-", "-"], "nothing shared: no duplicates to count"
