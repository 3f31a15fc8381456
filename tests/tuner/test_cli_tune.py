"""`mneme tune` and `mneme tune report DIR` through the real command-line entry point."""

from __future__ import annotations

import importlib.util
import json

import pytest

import tuner.results.report
import tuner.run
from mneme.cli import main
from tuner.options import resolve_options
from tuner.recording import KernelIdentity
from tuner.testing import FakeExecutor, NondeterministicExecutor


@pytest.fixture
def wired(monkeypatch, kernel):
    """Route the CLI's executor and recording loader to the test doubles."""
    executors = []

    def make_executor(options, results_dir, compile_ahead):
        ex = FakeExecutor(iterations=options.iterations, warmup=options.warmup, workers=options.workers)
        executors.append((options, ex))
        return ex

    monkeypatch.setattr(tuner.run, "default_executor", make_executor)
    monkeypatch.setattr(tuner.run, "load_instance",
                        lambda db, rid: (kernel, KernelIdentity("vecAdd", "15941914485064662553", rid)))
    return executors


def test_reference_builtin_example(tmp_path, wired, capsys):
    out = tmp_path / "vecadd-builtin"
    rc = main(["tune", "--record-database", "rec/15941914485064662553.json", "--record-id", "16313427880266313990",
               "--space-preset", "launch", "--launch-dim", "x", "--launch-safety", "aggressive",
               "--passes", "default<O1>", "default<O2>", "default<O3>", "default<Os>", "default<Oz>",
               "--fixed-codegen-opt", "3", "--sampler", "exhaustive", "--iterations", "5", "--warmup", "2",
               "--workers", "1", "--metric", "mean", "--objective", "time", "--results-dir", str(out)])
    assert rc == 0
    options, ex = wired[0]
    assert (options.iterations, options.warmup, options.workers) == (5, 2, 1)
    assert all(c.codegen_opt == 3 for c in ex.submitted)
    assert {c.passes for c in ex.submitted} == {"default<O1>", "default<O2>", "default<O3>", "default<Os>", "default<Oz>"}
    assert json.loads((out / "summary.json").read_text())["complete"]
    printed = capsys.readouterr().out
    assert "best configurations against the baseline" in printed and "│    │ baseline │" in printed
    assert f"results: {out}" in printed


def test_config_file_with_command_line_override(tmp_path, wired, space_module):
    cfg = tmp_path / "config.yml"
    cfg.write_text(f"record_database: rec/1.json\nrecord_id: \"163\"\nspace_module: {space_module}\n"
                   f"sampler: exhaustive\niterations: 5\nwarmup: 2\nmetric: mean\nobjective: time\n"
                   f"results_dir: {tmp_path / 'from-file'}\n")
    rc = main(["tune", "--config", str(cfg), "--iterations", "3", "--results-dir", str(tmp_path / "cli"), "--quiet"])
    assert rc == 0 and wired[0][0].iterations == 3
    config = json.loads((tmp_path / "cli" / "config.json").read_text())
    assert config["iterations"] == 3 and config["warmup"] == 2 and config["space_module"] == space_module


def test_bad_settings_exit_2_with_a_message(capsys):
    assert main(["tune", "-rdb", "x.json", "-rid", "1", "--sampler", "tpe"]) == 2
    assert "needs --trials" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["tune", "frobnicate"])
    assert exc.value.code == 2 and "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_report_says_which_package_to_install(tmp_path, wired, space_module, monkeypatch, capsys):
    run = tmp_path / "run"
    assert main(["tune", "-rdb", "r.json", "-rid", "1", "--space-module", space_module,
                 "--results-dir", str(run), "--quiet"]) == 0
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(tuner.results.report.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("matplotlib", "plotly") else real_find_spec(name, *a))
    assert main(["tune", "report", str(run)]) == 2
    err = capsys.readouterr().err
    assert "pip install" in err and "matplotlib" in err and "plotly" in err


def test_report_of_a_directory_without_a_run(tmp_path, capsys):
    assert main(["tune", "report", str(tmp_path)]) == 2
    assert "no trials.jsonl" in capsys.readouterr().err


def test_report_writes_png_and_html(tmp_path, wired, space_module, capsys):
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    assert main(["tune", "-rdb", "r.json", "-rid", "1", "--space-module", space_module,
                 "--results-dir", str(run), "--quiet"]) == 0
    assert main(["tune", "report", str(run)]) == 0
    report = run / "report"
    for plot in ("optimization_history", "param_importances", "slice"):
        assert (report / f"{plot}.png").stat().st_size > 1000
        if importlib.util.find_spec("plotly"):
            assert (report / f"{plot}.html").is_file()
    assert "best configurations" in (report / "index.html").read_text().lower()
    assert "wrote" in capsys.readouterr().out


def test_report_counts_trials_verified_exactly_and_within_tolerance(tmp_path, kernel, monkeypatch, capsys):
    monkeypatch.setattr(tuner.run, "default_executor", lambda options, results_dir, ahead: NondeterministicExecutor())
    monkeypatch.setattr(tuner.run, "load_instance",
                        lambda db, rid: (kernel, KernelIdentity("reduce", "15941914485064662553", rid)))
    run = tmp_path / "run"
    assert main(["tune", "-rdb", "r.json", "-rid", "1", "--space-preset", "launch", "--launch-dim", "x",
                 "--fixed-codegen-opt", "3", "--results-dir", str(run), "--quiet"]) == 0
    records = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    verified = [r for r in records if r["status"] == "verified"]
    exact = sum(1 for r in verified if all(e["exact"] for e in r["result"]["verified_within"].values()))
    assert 0 < exact < len(verified)  # both kinds are there to count
    monkeypatch.setattr(tuner.results.report, "PLOTS", ("optimization_history",))  # one plot is enough here
    capsys.readouterr()
    assert main(["tune", "report", str(run)]) == 0
    out = capsys.readouterr().out
    assert (f"verified: {exact} exactly, {len(verified) - exact} within tolerance; "
            "derived tolerance: acc=f32:ulp:12") in out
    assert f"({exact} exactly, {len(verified) - exact} within tolerance)" in (run / "report" / "index.html").read_text()
    summary = json.loads((run / "report" / "report.json").read_text())
    assert (summary["verified_exact"], summary["verified_within_tolerance"]) == (exact, len(verified) - exact)


def test_no_relocate_is_a_tune_option(tmp_path, wired):
    assert main(["tune", "--record-database", "rec/1.json", "--record-id", "163", "--space-preset", "launch",
                 "--launch-dim", "x", "--sampler", "exhaustive", "--no-relocate", "--results-dir", str(tmp_path / "r")]) == 0
    assert wired[0][0].verification.relocate is False
    assert resolve_options({"record_database": "a.json", "record_id": "1"}).verification.relocate is None


def test_no_relocate_reaches_the_replay_servers(tmp_path, monkeypatch):
    """The run's executor asks its servers to refuse, not relocate (InstanceRef.verification.relocate)."""
    import replay_server.client.executor

    seen = {}
    monkeypatch.setattr(replay_server.client.executor, "AsyncReplayExecutor", lambda **kwargs: seen.update(kwargs))
    options = resolve_options({"record_database": "a.json", "record_id": "1", "no_relocate": True})
    tuner.run.default_executor(options, tmp_path)
    assert seen["verification"].relocate is False


def test_json_prints_the_runs_summary_alone_on_stdout(tmp_path, wired, capsys):
    run = tmp_path / "run"
    rc = main(["tune", "-rdb", "rec/1.json", "-rid", "163", "--space-preset", "launch", "--launch-dim", "x",
               "--fixed-codegen-opt", "3", "--results-dir", str(run), "--json"])
    assert rc == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)  # standard output is that one object, nothing else
    assert summary["results_dir"] == str(run)
    assert summary["tuned_kernels"] == str(run / "proteus_tuned_kernels.json")
    written = json.loads((run / "summary.json").read_text())
    assert {key: summary[key] for key in written} == written  # summary.json's counts, why it stopped, ...
    assert summary["best"] == json.loads((run / "best.json").read_text())["best"]
    assert summary["best"]["speedup"] > 0 and summary["best_trial"] == summary["best"]["trial"]
    assert summary["trials"] == summary["verified"] + summary["failed"] > 0 and summary["stopped"] == "exhausted"
    # what the run says to a person goes to standard error: the table of the best, where the results are
    assert "best configurations against the baseline" in captured.err and f"results: {run}" in captured.err


def test_json_with_quiet_and_print_space(tmp_path, wired, capsys):
    run = tmp_path / "run"
    assert main(["tune", "-rdb", "rec/1.json", "-rid", "163", "--space-preset", "launch", "--launch-dim", "x",
                 "--results-dir", str(run), "--json", "--quiet", "--no-proteus-output"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["tuned_kernels"] is None and summary["verified"] > 0
    assert captured.err == f"results: {run} (plots: mneme tune report {run})\n"
    assert main(["tune", "-rdb", "rec/1.json", "-rid", "163", "--space-preset", "launch", "--print-space",
                 "--json"]) == 0
    assert "dimensions" in json.loads(capsys.readouterr().out)  # the space, as without --json
