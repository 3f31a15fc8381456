"""The Optuna study of a run, read back through Optuna's API as optuna-dashboard reads it: metric names,
the baseline as the first (enqueued) trial, failures as FAIL with their status, duplicates naming their
claim, and the TPE sampler still steered away from failing configurations."""

from __future__ import annotations

import io
import json

import optuna
import pytest

from mneme.model.experiment import STATUSES
from tuner.options import resolve_options
from tuner.run import run_tune
from tuner.strategies.failures import FAILED_ATTR
from tuner.strategies.sample_strategy import BASELINE_ATTR, DUPLICATE_ATTR
from tuner.strategies.shared_study import HASH_ATTR, open_storage
from tuner.testing import CUSTOM_SPACE, FakeExecutor

# The tests' block space, with a baseline that is one of its points (so it is the study's first trial).
SPACE = CUSTOM_SPACE + """

class WithBaseline(BlockSpace):
    def baseline(self):
        return self.derived({"block_dim_x": 256, "passes": "default<O3>"})
"""


@pytest.fixture
def space_module(tmp_path):
    path = tmp_path / "block_space.py"
    path.write_text(SPACE)
    return f"{path}:WithBaseline"


def tune(tmp_path, loader, space_module, **settings):
    options = resolve_options({"record_database": "rec/159.json", "record_id": "163", "space_module": space_module,
                               "results_dir": str(tmp_path / "run"), "adaptive_invalid_ban": False, **settings})
    return run_tune(options, executor_factory=lambda o, d, ahead: FakeExecutor(), instance_loader=loader,
                    out=io.StringIO(), is_tty=False)


def records(tmp_path):
    return [json.loads(line) for line in (tmp_path / "run" / "trials.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_the_study_holds_what_the_dashboard_shows(tmp_path, loader, space_module, sampler):
    storage = f"journal:{tmp_path / 'study.log'}"  # optuna-dashboard /path/study.log reads it
    assert tune(tmp_path, loader, space_module, sampler=sampler, trials=32, seed=2, optuna_storage=storage,
                study_name="s") == 0
    summaries = optuna.get_all_study_summaries(open_storage(storage))  # the dashboard's study list
    assert [s.study_name for s in summaries] == ["s"]
    study = optuna.load_study(study_name="s", storage=open_storage(storage))
    assert study.metric_names == ["mean_time_ns"]
    trials = study.get_trials(deepcopy=False)
    by_number = {t.number: t for t in trials}

    first = trials[0]  # the baseline, enqueued before anything else
    baseline = json.loads((tmp_path / "run" / "baseline.json").read_text())
    assert first.user_attrs[BASELINE_ATTR] is True and first.state.name == "COMPLETE"
    assert first.user_attrs["mneme"]["hash"] == baseline["hash"] and first.params["block_dim_x"] == 256
    assert first.user_attrs["configuration"] == baseline["configuration"]

    evaluated = [t for t in trials if "status" in t.user_attrs]
    run = sorted(records(tmp_path), key=lambda r: r["sampler_trial"])  # trials.jsonl: in the order they ended
    assert len(evaluated) == len(run) == 32
    assert [t.number for t in evaluated] == [r["sampler_trial"] for r in run]
    for t, record in zip(evaluated, run):
        assert t.user_attrs["status"] == record["status"] in STATUSES
        if record["status"] == "verified":
            assert t.state.name == "COMPLETE" and t.values == [record["metric"]]
            assert t.user_attrs["speedup"] == pytest.approx(record["speedup"])
        else:  # a failure is a failure, not a value
            assert t.state.name == "FAIL" and t.values is None
            assert t.user_attrs["mneme"]["error"] == record["error"] and t.user_attrs["speedup"] is None
    assert {t.user_attrs["status"] for t in evaluated if t.state.name == "FAIL"} >= {
        "invalid_launch", "compile_error", "failed_verification", "runtime_error"}

    duplicates = [t for t in trials if DUPLICATE_ATTR in t.system_attrs]
    assert duplicates  # 32 draws of 32 points: random and TPE repeat some
    for t in duplicates:
        claim = by_number[t.system_attrs[DUPLICATE_ATTR]]  # names the trial that evaluated it
        assert claim.number < t.number and "status" in claim.user_attrs
        assert claim.system_attrs[HASH_ATTR] == t.system_attrs[HASH_ATTR] and DUPLICATE_ATTR not in claim.system_attrs
        assert t.state == claim.state and t.values == claim.values
        if t.state.name == "FAIL":
            assert t.system_attrs[FAILED_ATTR] == claim.user_attrs["status"]
    assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]
    assert not [t for t in trials if t.values and any(v == float("inf") for v in t.values)]


def test_a_study_in_memory_is_the_same(tmp_path, loader, space_module, monkeypatch):
    """Without a storage the run's study is in memory; its trials are told the same way."""
    import tuner.strategies.sample_strategy as strategies

    made = []
    real = strategies.OptunaSamplingStrategy.__init__

    def keep(self, *args, **kwargs):
        real(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(strategies.OptunaSamplingStrategy, "__init__", keep)
    assert tune(tmp_path, loader, space_module, sampler="tpe", trials=20, seed=0, objective="speedup") == 0
    (strategy,) = made
    study = strategy.study
    assert study.metric_names == ["speedup_vs_baseline_mean"]
    trials = study.get_trials(deepcopy=False)
    assert trials[0].user_attrs[BASELINE_ATTR] and trials[0].values == [pytest.approx(1.0, rel=0.05)]
    assert {t.state.name for t in trials} <= {"COMPLETE", "FAIL"}
    failed = [t for t in trials if t.state.name == "FAIL"]
    assert failed and all(t.user_attrs.get("status") or t.system_attrs.get(FAILED_ATTR) for t in failed)


def test_resumed_failures_are_fail_trials_of_the_new_study(tmp_path, loader, space_module):
    assert tune(tmp_path, loader, space_module, sampler="random", trials=10, seed=1) == 0
    from tuner.space.factory import load_space_class
    from tuner.strategies.sample_strategy import OptunaSamplingStrategy
    from tuner.testing import vecadd_kernel

    strategy = OptunaSamplingStrategy(load_space_class(space_module)(vecadd_kernel()), "tpe", seed=0)
    earlier = records(tmp_path)
    assert strategy.seed_history(earlier) == 10
    trials = strategy.study.get_trials(deepcopy=False)
    for t, record in zip(trials, earlier):
        assert t.state.name == ("COMPLETE" if record["status"] == "verified" else "FAIL")
        assert t.user_attrs["status"] == record["status"]


def test_a_process_that_finds_the_shared_space_evaluated_succeeds(tmp_path, loader, space_module):
    """Another process of the study evaluated every configuration first: nothing failed in this one."""
    storage = f"journal:{tmp_path / 'study.log'}"
    shared = dict(sampler="random", trials=64, seed=2, optuna_storage=storage, study_name="s")
    assert tune(tmp_path, loader, space_module, **shared) == 0
    out = io.StringIO()
    options = resolve_options({"record_database": "rec/159.json", "record_id": "163", "space_module": space_module,
                               "results_dir": str(tmp_path / "late"), **shared})
    assert run_tune(options, executor_factory=lambda o, d, ahead: FakeExecutor(), instance_loader=loader,
                    out=out, is_tty=False) == 0
    assert "the other processes of study s evaluated every configuration" in out.getvalue()
    assert (tmp_path / "late" / "trials.jsonl").read_text() == ""


def test_a_study_servers_claim_holds_for_a_failed_configuration_and_not_for_a_stopped_tuner():
    """mneme study-server decides claims: a configuration that failed (FAIL with its status) stays claimed;
    a trial its tuner released (FAIL without a status) frees its configuration."""
    from tuner.study_claims import Claims

    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, study_name="s")
    claims = Claims(storage)

    def trial():
        t = study.ask()
        return t, t._trial_id

    failed, failed_id = trial()
    assert claims.claim(study._study_id, failed_id, "a") == failed.number
    storage.set_trial_user_attr(failed_id, "status", "compile_error")
    study.tell(failed, state=optuna.trial.TrialState.FAIL)
    again, again_id = trial()
    assert claims.claim(study._study_id, again_id, "a") == failed.number  # still the failed trial's
    assert storage.get_trial(again_id).system_attrs[DUPLICATE_ATTR] == failed.number

    stopped, stopped_id = trial()
    assert claims.claim(study._study_id, stopped_id, "b") == stopped.number
    study.tell(stopped, state=optuna.trial.TrialState.FAIL)  # released: no status
    taker, taker_id = trial()
    assert claims.claim(study._study_id, taker_id, "b") == taker.number
    fresh = Claims(storage)  # a restarted server reads the claims from the study
    late, late_id = trial()
    assert fresh.claim(study._study_id, late_id, "a") == failed.number
