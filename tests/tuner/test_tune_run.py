"""End-to-end runs of the tuner against the test executor: outputs, penalties, resume, modes."""

from __future__ import annotations

import io
import json
import os
import signal

import pytest

from mneme.errors import ConfigurationError
from mneme.model.verification import VerificationSettings
from tuner.errors import TuningError
from tuner.options import resolve_options
from tuner.run import default_executor, run_tune
from tuner.testing import FakeExecutor, NondeterministicExecutor

TRIAL_KEYS = {"trial", "status", "params", "configuration", "hash", "result", "metric", "speedup", "error"}


def tune(tmp_path, loader, executor=None, out=None, **settings):
    settings.setdefault("results_dir", str(tmp_path / "run"))
    settings.setdefault("record_database", "rec/159.json")
    settings.setdefault("record_id", "163")
    options = resolve_options(settings)
    executor = executor or FakeExecutor()
    out = out if out is not None else io.StringIO()

    def factory(o, d, compile_ahead):
        executor.compile_ahead = compile_ahead
        return executor

    rc = run_tune(options, executor_factory=factory, instance_loader=loader, out=out, is_tty=False)
    return rc, executor, out


def trials(tmp_path, name="run"):
    return [json.loads(line) for line in (tmp_path / name / "trials.jsonl").read_text().splitlines()]


def read(tmp_path, file, name="run"):
    return json.loads((tmp_path / name / file).read_text())


def test_builtin_launch_preset_writes_every_output(tmp_path, loader):
    rc, ex, out = tune(tmp_path, loader, space_preset="launch", launch_dim="x", launch_safety="aggressive",
                       passes=["default<O1>", "default<O2>", "default<O3>", "default<Os>", "default<Oz>"],
                       fixed_codegen_opt=3)
    assert rc == 0 and ex.shut
    run = tmp_path / "run"
    for name in ("config.json", "search_space.json", "baseline.json", "trials.jsonl", "best.json",
                 "summary.json", "logs/tune.log", "proteus_tuned_kernels.json"):
        assert (run / name).is_file(), name
    records = trials(tmp_path)
    space = read(tmp_path, "search_space.json")
    assert len(records) == space["size"] == len(ex.submitted)
    assert all(TRIAL_KEYS <= set(r) for r in records)
    assert len({r["hash"] for r in records}) == len(records)
    config = read(tmp_path, "config.json")
    assert config["space_preset"] == "launch" and config["launch_safety"] == "aggressive"
    assert config["kernel"]["name"] == "vecAdd"
    baseline = read(tmp_path, "baseline.json")
    assert baseline["verified"] and baseline["configuration"]["block"]["x"] == 256
    best = read(tmp_path, "best.json")["best"]
    verified = [r for r in records if r["status"] == "verified"]
    assert best["metric"] == min(r["metric"] for r in verified)
    assert best["speedup"] == pytest.approx(baseline["metric"] / best["metric"])
    summary = read(tmp_path, "summary.json")
    assert summary["trials"] == len(records) and summary["verified"] == len(verified)
    assert summary["complete"] and summary["stopped"] == "exhausted"
    assert summary["best_speedup"] == pytest.approx(best["speedup"])
    export = read(tmp_path, "proteus_tuned_kernels.json")
    (kernel,) = export["kernels"]
    assert kernel["name"] == "vecAdd" and kernel["static_hash"] == "15941914485064662553"
    assert kernel["configuration"] == best["configuration"]
    assert kernel["knobs"]["launch"]["block"] == best["configuration"]["block"]
    text = out.getvalue()
    assert "best configurations against the baseline" in text and "[1/" in text
    assert f"results: {run} (plots: mneme tune report {run})" in text
    best_row = next(line for line in text.splitlines() if line.startswith("│  1 │"))
    assert f"│ {best['trial']:>8} │" in best_row and f"{best['speedup']:.3f}" in best_row
    # tune.log: the run's events and its progress, not a line per trial (trials.jsonl has those).
    log = (run / "logs/tune.log").read_text()
    assert f"progress: {len(records)} trials in " in log and f"{len(verified)} verified" in log
    assert "trial 0 " not in log and "stopped: exhausted" in log
    # The five pipelines' code compiles ahead, one configuration each (the block size is not in the code).
    assert sorted(c.passes for c in ex.compile_ahead) == sorted(config["passes"])
    assert {c.code_knobs()["passes"] for c in ex.submitted} == {c.passes for c in ex.compile_ahead}


def test_failures_are_recorded_with_reasons_and_never_best(tmp_path, loader, space_module):
    rc, ex, _ = tune(tmp_path, loader, space_module=space_module, space_args=["high=512"],
                     adaptive_invalid_ban=False)
    records = trials(tmp_path)
    by_status = {}
    for r in records:
        by_status.setdefault(r["status"], []).append(r)
    assert set(by_status) == {"verified", "invalid_launch", "compile_error", "runtime_error", "failed_verification"}
    for status, rs in by_status.items():
        if status != "verified":
            assert all(r["error"] and r["metric"] is None and r["speedup"] is None for r in rs)
    # the wrong-answer configuration is by far the fastest, and must not win
    assert all(r["result"]["exec_time"][-1] == 1000 for r in by_status["failed_verification"])
    best = read(tmp_path, "best.json")["best"]
    assert best["configuration"]["block"]["x"] != FakeExecutor.UNVERIFIED_X
    assert read(tmp_path, "summary.json")["by_status"]["invalid_launch"] == 2


def test_adaptive_invalid_ban_skips_a_shape_after_it_fails(tmp_path, loader, space_module):
    # one worker keeps two replays in flight: the third pipeline of block 96 is asked for after
    # the first one's invalid launch came back, so it is skipped; the second may be running already
    tune(tmp_path, loader, space_module=space_module, workers=1,
         space_args=['passes=["default<O3>", "default<O2>", "default<Os>"]'])
    records = trials(tmp_path)
    invalid = sum(r["status"] == "invalid_launch" for r in records)
    summary = read(tmp_path, "summary.json")
    assert summary["skipped_banned"] >= 1 and invalid + summary["skipped_banned"] == 3
    assert summary["banned_blocks"] == [[96, 1, 1]]
    assert len(records) == 48 - summary["skipped_banned"]


def test_fail_fast_stops_at_the_first_failure(tmp_path, loader, space_module):
    rc, ex, out = tune(tmp_path, loader, space_module=space_module, fail_fast=True, workers=1)
    records = trials(tmp_path)
    assert rc == 1
    assert records[-1]["status"] != "verified" or records[-2]["status"] != "verified"
    assert len(records) < 32 and "--fail-fast" in out.getvalue()
    assert read(tmp_path, "summary.json")["stopped"] == "fail-fast"


def test_interrupted_run_resumes_where_it_stopped(tmp_path, loader, space_module):
    with pytest.raises(KeyboardInterrupt):
        tune(tmp_path, loader, FakeExecutor(interrupt_after=9), space_module=space_module, workers=1)
    first = trials(tmp_path)
    assert 0 < len(first) <= 9
    summary = read(tmp_path, "summary.json")
    assert summary["stopped"] == "interrupted" and not summary["complete"]
    # a run killed mid-write leaves half a line: resume cuts it off
    with open(tmp_path / "run" / "trials.jsonl", "a") as fh:
        fh.write('{"trial": 99, "status": "verif')
    ex = FakeExecutor()
    rc, ex, out = tune(tmp_path, loader, ex, space_module=space_module, resume=True)
    records = trials(tmp_path)
    assert rc == 0 and ex.evaluated == 0  # the baseline came from baseline.json
    banned = read(tmp_path, "summary.json")["skipped_banned"]
    assert len({r["hash"] for r in records}) == len(records) == 32 - banned
    assert not {c.ground().hash() for c in ex.submitted} & {r["hash"] for r in first}
    assert read(tmp_path, "summary.json")["skipped_resumed"] == len(first)
    assert {r["trial"] for r in records} == set(range(len(records)))
    assert "resuming" in out.getvalue()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_signal_while_a_trial_is_written_still_counts_it(tmp_path, loader, space_module, monkeypatch, signum):
    """SIGINT or SIGTERM between writing a trial and counting it: the summary agrees with trials.jsonl."""
    from tuner.results.directory import ResultsDirectory
    write = ResultsDirectory.append_trial

    def write_then_ctrl_c(self, record, *known):
        write(self, record, *known)
        if record["trial"] == 3:
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(ResultsDirectory, "append_trial", write_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        tune(tmp_path, loader, space_module=space_module, workers=1)
    # The signal waits for the batch of results being written: trial 3's, and at most one more (2 in flight).
    assert len(trials(tmp_path)) == read(tmp_path, "summary.json")["trials"] in (4, 5)


def test_rerun_baseline_replays_it_again(tmp_path, loader, space_module):
    tune(tmp_path, loader, space_module=space_module)
    rc, ex, _ = tune(tmp_path, loader, space_module=space_module, resume=True, rerun_baseline=True)
    assert ex.evaluated == 1 and ex.submitted == []


def test_a_new_run_refuses_a_used_directory(tmp_path, loader, space_module):
    tune(tmp_path, loader, space_module=space_module)
    with pytest.raises(ConfigurationError, match="--resume"):
        tune(tmp_path, loader, space_module=space_module)


def test_resume_of_another_instance_is_refused(tmp_path, loader, space_module):
    tune(tmp_path, loader, space_module=space_module)
    with pytest.raises(ConfigurationError, match="record-id"):
        tune(tmp_path, loader, space_module=space_module, resume=True, record_id="999")


def test_tpe_budget_and_resume_to_a_larger_budget(tmp_path, loader):
    rc, ex, _ = tune(tmp_path, loader, sampler="tpe", trials=20, seed=1)
    assert len(trials(tmp_path)) == 20 and len(ex.submitted) == 20
    rc, ex, _ = tune(tmp_path, loader, sampler="tpe", trials=30, seed=1, resume=True)
    records = trials(tmp_path)
    assert len(records) == 30 and len({r["hash"] for r in records}) == 30 and len(ex.submitted) == 10


def test_timeout_stops_submitting(tmp_path, loader):
    rc, ex, _ = tune(tmp_path, loader, sampler="random", trials=50, timeout=1e-9)
    assert trials(tmp_path) == [] and read(tmp_path, "summary.json")["stopped"] == "timeout"


def test_quiet_prints_nothing_but_where_the_results_are(tmp_path, loader, space_module, capsys):
    _, _, out = tune(tmp_path, loader, space_module=space_module, quiet=True)
    assert out.getvalue() == ""
    run = tmp_path / "run"
    assert capsys.readouterr().err == f"results: {run} (plots: mneme tune report {run})\n"


def test_the_default_results_directory_is_said(tmp_path, loader, space_module, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, _, out = tune(tmp_path, loader, space_module=space_module, results_dir=None)
    (run,) = (tmp_path / "mneme-tune-results").iterdir()
    assert f"results: mneme-tune-results/{run.name} " in out.getvalue()


def test_print_space_dry_run_and_baseline_only(tmp_path, loader, space_module):
    rc, ex, out = tune(tmp_path, loader, print_space=True, space_preset="quick")
    doc = json.loads(out.getvalue())
    assert rc == 0 and doc["dimensions"]["passes"]["choices"] == ["default<O3>", "default<O2>"]
    assert not (tmp_path / "run").exists() and ex.evaluated == 0
    rc, ex, out = tune(tmp_path, loader, dry_run=True, space_module=space_module)
    doc = json.loads(out.getvalue())
    assert doc["baseline"]["block"]["x"] == 256 and doc["search_space"]["size"] == 32
    assert ex.evaluated == 0 and not ex.submitted
    rc, ex, _ = tune(tmp_path, loader, baseline_only=True, space_module=space_module)
    assert rc == 0 and ex.evaluated == 1 and not ex.submitted and ex.compile_ahead == []
    assert read(tmp_path, "baseline.json")["verified"]
    assert read(tmp_path, "summary.json")["stopped"] == "baseline-only"


def test_unverified_baseline_stops_the_run_with_a_reason(tmp_path, loader, kernel):
    kernel.block_dim = type(kernel.block_dim)(FakeExecutor.UNVERIFIED_X)
    with pytest.raises(TuningError, match="baseline .* did not verify"):
        tune(tmp_path, loader, space_preset="compiler")
    assert read(tmp_path, "baseline.json")["status"] == "failed_verification"
    assert read(tmp_path, "best.json")["best"] is None


def test_a_broken_executor_ends_the_run_resumably(tmp_path, loader, space_module):
    # One replay thread: results come back in submission order (with two, a success could finish after
    # any number of later failures and end their streak).
    ex = FakeExecutor(raise_on=lambda c: 128 <= c.block.x != 256, workers=1)
    with pytest.raises(TuningError, match="5 times in a row"):
        tune(tmp_path, loader, ex, space_module=space_module, workers=1)
    records = trials(tmp_path)
    assert records and all(r["configuration"]["block"]["x"] < 128 for r in records)
    assert read(tmp_path, "summary.json")["executor_errors"] == 5


def test_invalid_derived_configurations_are_not_replayed(tmp_path, loader, space_module):
    tune(tmp_path, loader, space_module=space_module, space_args=["high=1280", "step=256"])
    records = trials(tmp_path)
    invalid = [r for r in records if r["status"] == "invalid_config"]
    assert {r["configuration"]["block"]["x"] for r in invalid} == {1280}
    assert "exceeds the CUDA limit" in invalid[0]["error"]


def test_speedup_objective_and_median_metric(tmp_path, loader, space_module):
    tune(tmp_path, loader, space_module=space_module, objective="speedup", metric="median")
    records = [r for r in trials(tmp_path) if r["status"] == "verified"]
    baseline = read(tmp_path, "baseline.json")["metric"]
    for r in records:
        assert r["objective_values"][0] == pytest.approx(baseline / r["metric"])
    assert read(tmp_path, "best.json")["best"]["speedup"] == max(r["speedup"] for r in records)


def test_nsga2_writes_a_pareto_front(tmp_path, loader):
    rc, ex, _ = tune(tmp_path, loader, sampler="nsga2", trials=24, seed=0, secondary_objective="registers")
    best = read(tmp_path, "best.json")
    assert rc == 0 and best["pareto_front"]
    assert all(len(r["objective_values"]) == 2 for r in trials(tmp_path) if r["status"] == "verified")


def test_proteus_export_can_be_moved_or_disabled(tmp_path, loader, space_module):
    target = tmp_path / "shared" / "tuned.json"
    target.parent.mkdir()
    target.write_text(json.dumps({"format": "mneme-tuned-kernels", "version": 1,
                                  "kernels": [{"name": "other", "static_hash": "1"}]}))
    tune(tmp_path, loader, space_module=space_module, proteus_output=str(target))
    names = [k["name"] for k in json.loads(target.read_text())["kernels"]]
    assert names == ["other", "vecAdd"]
    tune(tmp_path, loader, space_module=space_module, proteus_output=False, results_dir=str(tmp_path / "b"))
    assert not (tmp_path / "b" / "proteus_tuned_kernels.json").exists()


def test_default_results_directory_is_timestamped(tmp_path, loader, space_module, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tune(tmp_path, loader, space_module=space_module, results_dir=None)
    (run,) = (tmp_path / "mneme-tune-results").iterdir()
    assert run.name.endswith("-163") and (run / "summary.json").exists()


def test_terminal_shows_a_progress_bar(tmp_path, loader, space_module):
    out = io.StringIO()
    options = resolve_options({"record_database": "r.json", "record_id": "1", "space_module": space_module,
                               "results_dir": str(tmp_path / "run")})
    run_tune(options, executor_factory=lambda o, d, ahead: FakeExecutor(), instance_loader=loader, out=out, is_tty=True)
    text = out.getvalue()
    assert "tuning" in text and "failed" in text and "best" in text
    assert "[1/" not in text  # no per-trial lines under the bar


def test_config_json_reads_back_as_a_config_file(tmp_path, loader, space_module):
    tune(tmp_path, loader, space_module=space_module, metric="min", seed=3)
    again = resolve_options({"results_dir": str(tmp_path / "other")}, tmp_path / "run" / "config.json")
    assert again.metric == "min" and again.space_module == space_module and again.record_id == "163"


def test_persistent_optuna_study_continues_on_resume(tmp_path, loader):
    import optuna

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    settings = dict(sampler="tpe", seed=2, study_name="vecadd", optuna_storage=storage, pruner="median")
    tune(tmp_path, loader, trials=8, **settings)
    tune(tmp_path, loader, trials=12, resume=True, **settings)
    records = trials(tmp_path)
    assert len(records) == 12 and len({r["hash"] for r in records}) == 12
    assert all(isinstance(r["pruned"], bool) for r in records)
    study = optuna.load_study(study_name="vecadd", storage=storage)
    finished = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(finished) >= 12


def test_nondeterministic_baseline_is_judged_with_the_tolerance_derived_once(tmp_path, loader):
    ex = NondeterministicExecutor()
    rc, ex, out = tune(tmp_path, loader, ex, space_preset="launch", launch_dim="x", fixed_codegen_opt=3)
    assert rc == 0
    # every trial judged with the baseline's bound
    assert ex.verifications == [VerificationSettings(mode="exact", derived={"acc": "f32:ulp:12"})]
    assert "tolerance: derived from 8 runs of the baseline: acc=f32:ulp:12" in out.getvalue()
    baseline = read(tmp_path, "baseline.json")
    assert baseline["tolerance"]["policies"] == {"acc": "f32:ulp:12"}
    assert baseline["tolerance"]["provenance"]["runs"] == 8
    summary = read(tmp_path, "summary.json")
    records = trials(tmp_path)
    within = [r for r in records if r["verified"] and r["configuration"]["block"]["x"] not in (128, 256)]
    assert summary["verified_within_tolerance"] == len(within) > 0
    assert summary["verified_exact"] + summary["verified_within_tolerance"] == summary["verified"]
    assert summary["tolerance"]["mode"] == "auto" and summary["tolerance"]["policies"] == {"acc": "f32:ulp:12"}
    assert "within tolerance" in out.getvalue()


def test_explicit_policies_and_runs_reach_the_executor_and_the_outputs(tmp_path, loader, monkeypatch):
    import replay_server.client.executor

    made = {}
    monkeypatch.setattr(replay_server.client.executor, "AsyncReplayExecutor", lambda *a, **kwargs: made.update(kwargs))
    settings = dict(tolerance=["acc=f32:ulp:16"], tolerance_runs=12)
    default_executor(resolve_options({"record_database": "rec/159.json", **settings}), tmp_path, [],
                     local_servers=object())
    assert made["verification"] == VerificationSettings(mode="auto", runs=12, overrides={"acc": "f32:ulp:16"})
    rc, ex, out = tune(tmp_path, loader, NondeterministicExecutor(), space_preset="launch", launch_dim="x",
                       fixed_codegen_opt=3, **settings)
    assert rc == 0
    assert "tolerance: explicit policies (win over annotations and derived bounds): acc=f32:ulp:16" in out.getvalue()
    assert read(tmp_path, "summary.json")["tolerance"]["explicit"] == {"acc": "f32:ulp:16"}
    config = read(tmp_path, "config.json")
    assert config["tolerance_policies"] == {"acc": "f32:ulp:16"} and config["tolerance_runs"] == 12


def test_exact_tolerance_sends_nothing(tmp_path, loader):
    ex = NondeterministicExecutor()
    rc, ex, out = tune(tmp_path, loader, ex, space_preset="launch", launch_dim="x", fixed_codegen_opt=3,
                       tolerance="exact")
    assert rc == 0 and ex.verifications == []
    with pytest.raises(ConfigurationError, match="--tolerance"):
        resolve_options({"record_database": "a.json", "record_id": "1", "tolerance": "loose"})


def test_the_loop_keeps_the_servers_capacity_in_flight():
    from types import SimpleNamespace

    from tuner.run import in_flight

    assert in_flight(SimpleNamespace(capacity=56), workers=2) == 56  # what the servers hold at once
    assert in_flight(object(), workers=3) == 6  # an executor that does not say: two per worker
