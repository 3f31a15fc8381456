"""CPU tests of the headline benchmark's plumbing: parsing the examples' output,
finding a recorded instance, the search spaces, stage isolation, the table,
the JSON and the chart. The GPU measurements themselves run on the GPU machine
(`python bench/headline.py --out DIR`).
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import headline
import headline_apps as apps
import headline_report as report
import headline_stages as stages
import pytest

from mneme.model.experiment import Dim3

REPO = Path(__file__).resolve().parents[2]

CG_OUTPUT = """minife_cg: grid 88x88x88, 681472 rows, 17984728 nonzeros, 50 iterations
KERNEL_TIME kernel=spmv_csr launches=51 mean_us=151.250 median_us=150.125 min_us=149.000
KERNEL_TIME kernel=dot launches=151 mean_us=10.000 median_us=9.500 min_us=9.000
residual: true 2.765e-08, recurrence 2.765e-08, bound 1.620e-05
PASS
"""


def test_parse_kernel_times_reads_every_line():
    times = apps.parse_kernel_times(CG_OUTPUT)
    assert times["spmv_csr"] == {"launches": 51, "mean_us": 151.25, "median_us": 150.125, "min_us": 149.0}
    assert times["dot"]["launches"] == 151
    assert apps.parse_kernel_times("no timing here\nPASS\n") == {}


def test_verdict_is_the_last_pass_or_fail_line():
    assert apps.verdict(CG_OUTPUT) == "PASS"
    assert apps.verdict("x\nFAIL: 3 points differ\n") == "FAIL: 3 points differ"
    assert apps.verdict("nothing\n") is None


def test_workload_commands_point_into_the_build_folder(tmp_path):
    cg = apps.workload("minife_cg")
    assert cg.command(tmp_path) == [str(tmp_path / "minife_cg" / "cg")]
    cupy = apps.workload("cupy_nvrtc")
    assert cupy.command(tmp_path) == [sys.executable, str(REPO / "examples" / "cupy_nvrtc" / "cupy_kernels.py")]
    with pytest.raises(apps.StepError, match="known: vecadd"):
        apps.workload("nope")


def _fake_app(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "app.sh"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_run_app_times_and_parses(tmp_path):
    app = _fake_app(tmp_path, f"cat <<'EOF'\n{CG_OUTPUT}EOF\n")
    run = apps.run_app([str(app)], timeout_s=30, cwd=tmp_path)
    assert run.passed and run.wall_s > 0
    assert run.kernel_times["spmv_csr"]["median_us"] == 150.125


def test_run_app_reports_failures_and_hangs(tmp_path):
    failing = _fake_app(tmp_path, "echo 'FAIL: wrong answer'\necho oops >&2\nexit 1\n")
    run = apps.run_app([str(failing)], timeout_s=30, cwd=tmp_path)
    assert not run.passed and "oops" in run.explain() and "FAIL: wrong answer" in run.explain()
    hanging = _fake_app(tmp_path, "sleep 30\n")
    with pytest.raises(apps.StepError, match="ran past 1 s"):
        apps.run_app([str(hanging)], timeout_s=1, cwd=tmp_path)


def test_measure_recording_refuses_an_app_that_does_not_pass(tmp_path):
    w = apps.Workload("fake", "fake", (str(_fake_app(tmp_path, "echo 'FAIL: no'\nexit 1\n")),), "k", "k")
    with pytest.raises(apps.StepError, match="did not pass without recording"):
        apps.measure_recording(w, tmp_path, tmp_path, repeats=1, timeout_s=30)


def test_measure_recording_alternates_plain_and_recorded_runs(tmp_path, monkeypatch):
    """With `mneme record` stood in by a script that runs the app and writes a file, as a recorder would."""
    app = _fake_app(tmp_path, f"cat <<'EOF'\n{CG_OUTPUT}EOF\n")
    calls = []

    def fake_record_command(record_dir, cmd, extra=()):
        calls.append(("record", Path(record_dir)))
        return ["sh", "-c", f'mkdir -p "{record_dir}" && head -c 1000 /dev/zero > "{record_dir}/1.json" && "$0"',
                *cmd]

    monkeypatch.setattr(apps, "record_command", fake_record_command)
    w = apps.Workload("fake", "fake", (str(app),), "spmv_csr", "spmv")
    measured = apps.measure_recording(w, tmp_path, tmp_path, repeats=2, timeout_s=30)
    assert len(measured.plain_s) == len(measured.recorded_s) == 2 and len(calls) == 2
    assert measured.record_bytes == 1000 and measured.record_dir == str(tmp_path / "recordings" / "fake")
    assert measured.kernel_times["spmv_csr"]["launches"] == 51
    assert measured.overhead_ratio == pytest.approx(measured.recorded_median_s / measured.plain_median_s)


def test_measure_recording_reports_a_skip(tmp_path):
    w = apps.Workload("fake", "fake", (str(_fake_app(tmp_path, "echo 'SKIP: no CuPy' >&2\nexit 77\n")),), "k", "k")
    with pytest.raises(apps.StepSkipped, match="SKIP: no CuPy"):
        apps.measure_recording(w, tmp_path, tmp_path, repeats=1, timeout_s=30)


def _database(path: Path, name: str, instances: dict, bitcode: bool = False) -> None:
    path.write_text(json.dumps({
        "kernel": {"name": name, "demangled": name.replace("_Z8", "") + "(...)"},
        "code": {"ptx": {"name": "k.ptx"}, "bitcode": {"name": "k.bc"} if bitcode else None},
        "instances": instances,
    }))


def test_find_instance_picks_the_last_launch_of_the_matching_kernel(tmp_path):
    _database(tmp_path / "1.json", "_Z3dotiPKdS0_Pd", {"5": {"launch_index": 3}})
    _database(tmp_path / "2.json", "_Z8spmv_csriPKiS0_PKdS2_Pd", {
        "11": {"launch_index": 0, "grid": {"x": 2000, "y": 1, "z": 1}, "block": {"x": 256, "y": 1, "z": 1},
               "shared_mem": 0, "app_kernel_time_ns": None},
        "22": {"launch_index": 7, "grid": {"x": 2000, "y": 1, "z": 1}, "block": {"x": 256, "y": 1, "z": 1},
               "shared_mem": 0, "app_kernel_time_ns": 150000},
    }, bitcode=True)
    (tmp_path / "junk.json").write_text("{not json")
    found = apps.find_instance(tmp_path, r"spmv_csr")
    assert found.record_id == "22" and found.database.endswith("2.json")
    assert found.app_kernel_time_ns == 150000 and found.has_bitcode
    with pytest.raises(apps.StepError, match=r"kernels recorded: .*dot"):
        apps.find_instance(tmp_path, r"jacobi7")


def _kernel(grid: Dim3, block: Dim3, shared_mem: int = 0):
    return SimpleNamespace(grid_dim=grid, block_dim=block, shared_mem=shared_mem)


def test_reference_vecadd_space_is_the_references_80_configurations():
    space, key = stages.make_space("reference_vecadd", _kernel(Dim3(40000), Dim3(256)), has_bitcode=True)
    from tuner.strategies.sample_strategy import ExhaustiveSamplingStrategy

    configs = list(ExhaustiveSamplingStrategy(space))
    assert key == "passes" and len(configs) == 80
    assert {c.block.x for c in configs} == set(range(64, 1025, 64))
    assert {(c.block.x, c.grid.x) for c in configs if c.block.x in (64, 256, 1024)} == {
        (64, 160000), (256, 40000), (1024, 10000)}  # the grid covers the recorded 10 240 000 threads
    assert {c.passes for c in configs} == set(stages.PIPELINES)
    assert space.baseline().block.x == 256


def test_spmv_space_covers_the_rows_with_every_block_size():
    space, key = stages.make_space("spmv", _kernel(Dim3(2000), Dim3(256)), has_bitcode=False)
    from tuner.strategies.sample_strategy import ExhaustiveSamplingStrategy

    configs = list(ExhaustiveSamplingStrategy(space))
    assert key == "codegen_opt" and len(configs) == 32 * len(stages.CODEGEN_LEVELS)
    for c in configs:
        assert c.grid.x * c.block.x >= 2000 * 256 > (c.grid.x - 1) * c.block.x
        assert c.is_valid()


def test_time_summary_in_microseconds():
    assert stages.time_summary([1000, 3000, 2000]) == {"mean_us": 2.0, "median_us": 2.0, "min_us": 1.0,
                                                       "samples": 3}
    assert stages.time_summary([]) == {}


def test_a_failing_stage_reports_its_error_without_stopping_the_run(tmp_path):
    result = headline.run_stage("fidelity", tmp_path, "missing", 120,
                                ["--database", str(tmp_path / "nope.json"), "--record-id", "1"])
    assert "error" in result
    assert "nope.json" in result["error"]
    assert (tmp_path / "stages" / "fidelity-missing.json").is_file()


def test_a_hanging_stage_is_killed(tmp_path, monkeypatch):
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setattr(headline, "STAGES_SCRIPT", sleeper)
    result = headline.run_stage("tune", tmp_path, "hang", 1, [])
    assert "ran past 1 s" in result["error"]


def _full_results() -> dict:
    return {
        "meta": {"date": "2026-11-23 03:00 UTC", "gpu": "NVIDIA H100 80GB HBM3", "commit": "abc123"},
        "build": {"ok": True},
        "workloads": {
            "minife_cg": {
                "recording": {"plain_median_s": 1.5, "recorded_median_s": 3.0, "overhead_ratio": 2.0,
                              "record_bytes": 123_400_000},
                "fidelity": {"replay_median_us": 151.5, "app_median_us": 150.0, "ratio": 1.01, "verified": True,
                             "recorder_app_kernel_time_us": 152.0},
            },
            "stencil3d": {
                "recording": {"error": "stencil3d did not pass under mneme record: " + "x" * 300},
                "fidelity": {"error": "no recording (see the recording row)"},
            },
            "cupy_nvrtc": {"recording": {"skipped": "SKIP: CuPy is not installed"},
                           "fidelity": {"skipped": "no recording"}},
        },
        "tuning": {
            "vecadd": {"verified_per_s": 120.0, "verified": 75, "configurations": 80, "sweep_s": 0.625,
                       "iterations": 5, "warmup": 2, "compile_dimension": "passes", "baseline_mean_us": 80.0,
                       "best": {"speedup": 1.2, "block_dim_x": 128, "passes": "default<O1>", "mean_us": 66.7}},
            "minife_cg": {"error": "RuntimeError: the baseline replay did not verify"},
        },
    }


def test_table_shows_numbers_reference_figures_and_errors_in_place():
    rows = report.table_rows(_full_results())
    text = report.format_table(rows)
    lines = text.splitlines()
    assert lines[0].startswith("| measurement") and set(lines[1]) <= {"|", "-", " "}
    assert len({len(line) for line in lines}) == 1  # aligned columns
    assert "1.50 s -> 3.00 s (x2.00, 123.4 MB recorded)" in text and "36 s -> 38 s" in text
    assert "151.5 us / 150.0 us = 1.010" in text and "recorder's in-app time 152.0 us" in text
    assert "120.0 (75/80 verified in 0.62 s, 5+2 launches each)" in text and "11.3 configs/s" in text
    assert "x1.20 (blockDim.x=128, passes=default<O1>" in text and "x1.12" in text
    assert "error: RuntimeError: the baseline replay did not verify" in text
    assert "1.26 observations/s" in text
    assert "skipped: SKIP: CuPy is not installed" in text
    stencil = next(r for r in rows if r[1] == "stencil3d" and r[0].startswith("recording"))
    assert stencil[2].endswith("...") and len(stencil[2]) == report.MAX_ERROR_CELL


def test_fidelity_falls_back_to_the_recorders_in_app_time():
    fid = {"replay_median_us": 50.0, "app_median_us": None, "recorder_app_kernel_time_us": 49.0, "verified": True}
    assert report.fidelity_text(fid) == "50.0 us / 49.0 us (recorder's in-app time) = 1.020"


def test_verdict_of_a_program_with_its_own_success_line():
    vecadd = apps.workload("vecadd")
    out = "vecadd n=10240000 iterations=1: ok (a=0x7f0000000000 b=0x7f0002800000 c=0x7f0005000000)\n"
    assert apps.verdict(out, vecadd.pass_pattern) == "PASS"
    assert apps.verdict(out.replace(": ok", ": WRONG"), vecadd.pass_pattern) is None


def test_failed_stages_name_where_failures_began_and_ignore_skips():
    assert headline.failed_stages(_full_results()) == ["stencil3d recording", "tuning minife_cg"]


def test_unverified_replay_is_flagged_in_the_table():
    fid = {"replay_median_us": 10.0, "app_median_us": 10.0, "verified": False, "status": "failed_verification",
           "error": "buffer 0 differs"}
    assert "NOT VERIFIED (failed_verification: buffer 0 differs)" in report.fidelity_text(fid)


def test_json_and_chart_outputs(tmp_path):
    results = _full_results()
    report.write_json(results, tmp_path / "h.json")
    assert json.loads((tmp_path / "h.json").read_text())["tuning"]["vecadd"]["verified"] == 75
    note = report.write_chart(results, tmp_path / "h.png")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in note
        assert not (tmp_path / "h.png").exists()
    else:
        assert note is None
        assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _FakeFuture:
    def __init__(self, outcome):
        self._outcome = outcome

    def result(self, timeout=None):
        if isinstance(self._outcome, Exception):
            raise self._outcome
        return self._outcome


class _ScriptedExecutor:
    """Plumbing double of AsyncReplayExecutor: kernel time = 100 us - block/16, blocks < 128 unverified."""

    def __init__(self, baseline_verified=True):
        self.baseline_verified = baseline_verified
        self.submitted = []

    def evaluate(self, config):
        from mneme.model.experiment import ExperimentResult

        return ExperimentResult(exec_time=[999, 100_000, 100_000], warmup=1, verified=self.baseline_verified,
                                status="verified" if self.baseline_verified else "failed_verification",
                                error="" if self.baseline_verified else "buffer 2 differs")

    def submit(self, config):
        from mneme.model.experiment import ExperimentResult

        self.submitted.append(config)
        if config.block.x == 1024 and config.codegen_opt == 4:
            return _FakeFuture(ConnectionError("server went away"))
        if config.block.x < 128:
            return _FakeFuture(ExperimentResult.failure("failed_verification", "work left undone"))
        t = int(100_000 - config.block.x * 1000 / 16) - config.codegen_opt
        return _FakeFuture(ExperimentResult(exec_time=[5, t, t], warmup=1, verified=True, status="verified"))


def test_sweep_counts_times_and_ranks_results():
    space, key = stages.make_space("spmv", _kernel(Dim3(2000), Dim3(256)), has_bitcode=False)
    executor = _ScriptedExecutor()
    out = stages.sweep(executor, space, key)
    assert len(executor.submitted) == out["configurations"] == 160
    # blocks 32, 64, 96 fail verification (15 configurations); one raises and is counted as failed
    assert out["verified"] == 160 - 15 - 1
    assert out["statuses"] == {"verified": 144, "failed_verification": 15, "internal_error": 1}
    assert "ConnectionError: server went away" in out["first_errors"]
    assert out["verified_per_s"] == pytest.approx(144 / out["sweep_s"])
    best = out["best"]
    assert best["block_dim_x"] == 1024 and best["codegen_opt"] == 3  # (1024, 4) failed
    assert best["speedup"] == pytest.approx(100_000 / (100_000 - 64_000 - 3))
    assert out["baseline_mean_us"] == 100.0


def test_a_long_sweep_repeats_the_space_and_says_so():
    space, key = stages.make_space("spmv", _kernel(Dim3(2000), Dim3(256)), has_bitcode=False)
    executor = _ScriptedExecutor()
    out = stages.sweep(executor, space, key, min_configs=1000)
    assert (out["passes"], out["space_configurations"], out["configurations"]) == (7, 160, 1120)
    assert len(executor.submitted) == 1120 and out["verified"] == 7 * 144
    assert out["best"]["block_dim_x"] == 1024
    assert headline.parse_args(["--out", "x"]).tune_min_configs == 1000


def test_sweep_refuses_an_unverified_baseline():
    space, key = stages.make_space("spmv", _kernel(Dim3(2000), Dim3(256)), has_bitcode=False)
    with pytest.raises(RuntimeError, match="baseline replay did not verify .*buffer 2 differs"):
        stages.sweep(_ScriptedExecutor(baseline_verified=False), space, key)


def test_one_command_defaults_match_the_reference_protocol(tmp_path):
    opts = headline.parse_args(["--out", str(tmp_path)])
    assert (opts.tune_iterations, opts.tune_warmup, opts.workers) == (5, 2, 1)
    assert opts.workloads == [w.name for w in apps.WORKLOADS]
    with pytest.raises(SystemExit):
        headline.parse_args(["--out", str(tmp_path), "--repeats", "0"])
    assert headline.default_arch({"compute_cap": "9.0"}) == "sm_90"
    assert headline.default_arch({}) == "sm_90"
    assert headline.default_arch({"compute_cap": "10.0"}) == "sm_100"
