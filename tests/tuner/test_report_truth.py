"""`mneme tune report`, `compare` and `export`: every trial under its own number, failures as failures,
the parameters that vary (block shapes as integer axes), log axes over decades, the baseline drawn,
pages that work offline; two runs compared; trials as flat CSV."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess

import pytest

import tuner.run
from mneme.cli import main
from mneme.model.experiment import ExperimentResult
from tuner.recording import KernelIdentity
from tuner.results.directory import ResultsDirectory
from tuner.results.plots import plotly_figure
from tuner.results.report import plotting_for
from tuner.testing import FakeExecutor, vecadd_kernel

pytest.importorskip("plotly")
pytest.importorskip("matplotlib")


class DecadesExecutor(FakeExecutor):
    """Times that span three decades over the block sizes (a tiny block is a thousand times slower)."""

    def _run(self, config):
        result = super()._run(config)
        if result.verified:
            t = int(80_000 * (256 / config.block.count) ** 1.5)
            result = ExperimentResult(exec_time=[t] * len(result.exec_time), verified=True, executed=True,
                                      warmup=self.warmup, status="verified", reg_usage=result.reg_usage,
                                      obj_size=result.obj_size, gpu_id=0)
        return result


@pytest.fixture
def wire(monkeypatch):
    def wire(kernel=None, executor=FakeExecutor):
        kernel = kernel or vecadd_kernel()
        monkeypatch.setattr(tuner.run, "default_executor", lambda o, d, ahead: executor())
        monkeypatch.setattr(tuner.run, "load_instance", lambda db, rid: (
            kernel, KernelIdentity("vecAdd", "15941914485064662553", rid or "163")))
    return wire


def tune(run, *flags):
    assert main(["tune", "-rdb", "rec/159.json", "-rid", "163", "--results-dir", str(run), "--quiet", *flags]) in (0, 1)
    return [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]


def test_every_trial_keeps_its_number_and_failures_are_failures(tmp_path, wire, space_module, capsys):
    wire()
    run = tmp_path / "run"
    records = tune(run, "--space-module", space_module, "--no-adaptive-invalid-ban")
    plotting = plotting_for(ResultsDirectory(run), records)
    trials = plotting.study.get_trials(deepcopy=False)
    assert [t.number for t in trials] == sorted(r["trial"] for r in records) == list(range(len(records)))
    by_number = {r["trial"]: r for r in records}
    for t in trials:
        record = by_number[t.number]
        assert t.user_attrs["status"] == record["status"]
        assert t.state.name == ("COMPLETE" if record["status"] == "verified" else "FAIL")
    assert {n for n, _, _ in plotting.failures} == {r["trial"] for r in records if r["status"] != "verified"}
    history = plotly_figure(plotting, "optimization_history")
    failed = [trace for trace in history.data if trace.name and trace.name.startswith("failed")]
    assert failed and sorted(failed[0].x) == sorted(n for n, _, _ in plotting.failures)
    plotted = sorted(x for trace in history.data if trace.name == plotting.target_name for x in trace.x)
    assert plotted == sorted(t.number for t in plotting.completed)  # numbers of trials.jsonl, gaps and all
    baseline = json.loads((run / "baseline.json").read_text())["metric"]
    assert [shape.y0 for shape in history.layout.shapes] == [baseline]  # the baseline's line


def test_block_shapes_are_integer_axes_and_fixed_parameters_are_left_out(tmp_path, wire):
    wire(kernel=vecadd_kernel(grid=(64, 64, 1), block=(16, 16, 1)))
    run = tmp_path / "run"
    records = tune(run, "--space-preset", "launch", "--launch-dim", "xy", "--launch-safety", "conservative")
    assert {"block_shape", "passes", "codegen_opt"} <= set(records[0]["params"])
    plotting = plotting_for(ResultsDirectory(run), records)
    assert plotting.varying == ["block_x", "block_y"]  # no passes/codegen_opt (fixed), no threads_per_block
    params = set().union(*(t.params for t in plotting.study.get_trials(deepcopy=False)))
    assert params == {"block_x", "block_y"}
    distribution = plotting.study.get_trials(deepcopy=False)[0].distributions["block_x"]
    assert type(distribution).__name__ == "IntDistribution" and distribution.log  # 1..256: decades
    assert main(["tune", "report", str(run)]) == 0
    importances = (run / "report" / "param_importances.html").read_text()
    assert "block_x" in importances and "threads_per_block" not in importances and "codegen_opt" not in importances


def test_values_over_decades_get_log_axes(tmp_path, wire):
    wire(executor=DecadesExecutor)
    run = tmp_path / "run"
    records = tune(run, "--space-preset", "launch", "--launch-dim", "x")
    plotting = plotting_for(ResultsDirectory(run), records)
    assert plotting.log_values
    for plot in ("optimization_history", "slice"):
        assert plotly_figure(plotting, plot).layout.yaxis.type == "log"


def render(page):
    """The page's DOM after headless Chromium ran it, with every host name unresolvable (offline)."""
    done = subprocess.run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                           "--host-resolver-rules=MAP * ~NOTFOUND", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    return done.stdout


def test_the_report_works_offline(tmp_path, wire, space_module, capsys):
    wire()
    run = tmp_path / "run"
    tune(run, "--space-preset", "standard", "--launch-dim", "x", "--sampler", "tpe", "--trials", "24", "--seed", "1")
    assert main(["tune", "report", str(run)]) == 0
    out = capsys.readouterr().out
    report = run / "report"
    assert f"open {report / 'index.html'} (works offline)" in out
    pages = sorted(report.glob("*.html"))
    assert {p.stem for p in pages} >= {"index", "optimization_history", "param_importances", "slice",
                                       "parallel_coordinate", "contour", "timeline"}
    assert [p.name for p in report.glob("*.js")] == ["plotly.min.js"]  # written once, beside the pages
    for page in pages:
        text = page.read_text()
        assert not re.search(r"<script[^>]*src=[\"']?(https?:)?//", text), page.name
        assert "cdn.plot.ly" not in text and "cdn.jsdelivr" not in text
        if page.name != "index.html":
            assert '<script charset="utf-8" src="plotly.min.js"></script>' in text
    index = (report / "index.html").read_text()
    assert "http://" not in index and "https://" not in index
    if shutil.which("chromium") is None:
        pytest.skip("chromium is not installed: the pages were checked for remote scripts only")
    for name in ("optimization_history", "contour", "timeline"):
        assert 'class="main-svg"' in render(report / f"{name}.html"), name  # plotly drew it, offline


def test_the_index_lists_the_best_against_the_baseline_and_the_failures(tmp_path, wire, space_module):
    wire()
    run = tmp_path / "run"
    records = tune(run, "--space-module", space_module, "--no-adaptive-invalid-ban")
    assert main(["tune", "report", str(run)]) == 0
    index = (run / "report" / "index.html").read_text()
    baseline = json.loads((run / "baseline.json").read_text())["metric"]
    best = min((r for r in records if r["status"] == "verified"), key=lambda r: r["metric"])
    assert "Best configurations against the baseline" in index and "<td>baseline</td>" in index
    assert f"<td>1</td><td>{best['trial']}</td>" in index and f"{baseline / best['metric']:.3f}" in index
    for status in ("invalid_launch", "compile_error", "failed_verification", "runtime_error"):
        assert f"<td>{status}</td>" in index
    assert "<h2>Not drawn</h2>" in index and "pareto_front: a single-objective run" in index
    assert "<img src='optimization_history.png'" in index and "<a href='slice.html'>" in index


def test_nsga2_runs_get_a_pareto_front(tmp_path, wire):
    wire()
    run = tmp_path / "run"
    tune(run, "--space-preset", "quick", "--launch-dim", "x", "--sampler", "nsga2", "--trials", "16", "--seed", "0")
    assert main(["tune", "report", str(run)]) == 0
    assert (run / "report" / "pareto_front.html").is_file() and (run / "report" / "pareto_front.png").is_file()
    assert "mean_time_ns" in (run / "report" / "pareto_front.html").read_text()


def test_compare_two_runs(tmp_path, wire, capsys):
    wire()
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    tune(a, "--space-preset", "launch", "--launch-dim", "x")
    tune(b, "--space-preset", "launch", "--launch-dim", "x", "--sampler", "random", "--trials", "8")
    tune(c, "--space-preset", "launch", "--launch-dim", "x", "--metric", "min")
    capsys.readouterr()
    assert main(["tune", "compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "settings that give trials their meaning: the same" in out
    assert "8 configurations in both, " in out and "B's time / A's median 1.000" in out
    assert main(["tune", "compare", str(a), str(c)]) == 0
    out = capsys.readouterr().out
    assert "they differ" in out and "--metric: mean -> min" in out and "B's best time / A's best time:" in out
    with pytest.raises(SystemExit) as exc:  # its own parser says what is missing, with its usage
        main(["tune", "compare", str(a)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage: mneme tune compare [-h] A B" in err and "the following arguments are required: B" in err


def test_export_csv_has_flat_columns(tmp_path, wire, space_module, capsys):
    wire()
    run = tmp_path / "run"
    records = tune(run, "--space-module", space_module)
    capsys.readouterr()
    assert main(["tune", "export", str(run), "--csv"]) == 0
    assert capsys.readouterr().out == f"wrote {run / 'trials.csv'} ({len(records)} trials)\n"
    rows = list(csv.DictReader((run / "trials.csv").open()))
    assert len(rows) == len(records)
    columns = set(rows[0])
    assert {"trial", "status", "metric", "speedup", "error", "param.block_dim_x", "param.passes",
            "configuration.block.x", "configuration.grid.x", "result.exec_time", "result.status",
            "objective_value.0"} <= columns
    assert not any(value.startswith("{") for value in rows[0].values() if value)  # flat, not nested JSON
    first = records[0]
    assert rows[0]["param.block_dim_x"] == str(first["params"]["block_dim_x"])
    assert rows[0]["result.exec_time"] == ";".join(str(t) for t in first["result"]["exec_time"])
    assert main(["tune", "export", str(run), "--csv", "-"]) == 0
    assert list(csv.DictReader(io.StringIO(capsys.readouterr().out))) == rows
    assert main(["tune", "export", str(run)]) == 2
    assert "--csv" in capsys.readouterr().err
    (tmp_path / "plain").write_text("x")
    assert main(["tune", "export", str(run), "--csv", str(tmp_path / "plain" / "t.csv")]) == 2
    assert f"cannot write {tmp_path / 'plain' / 't.csv'}: Not a directory" in capsys.readouterr().err
