"""`mneme tune --metrics` and `--objective METRIC`: options, trial records, ranking, and the executor's request."""

from __future__ import annotations

import io
import json

import pytest

import tuner.run
from mneme.cli import main
from mneme.errors import ConfigurationError, NotAvailableError
from tuner.objective import Objective, rank_value
from tuner.options import resolve_options
from tuner.recording import KernelIdentity
from tuner.run import default_executor, run_tune
from tuner.testing import FakeExecutor, model_counters

LAUNCH = dict(space_preset="launch", launch_dim="x", launch_safety="aggressive", fixed_codegen_opt=3)


def tune(tmp_path, loader, executor, **settings):
    settings.setdefault("results_dir", str(tmp_path / "run"))
    settings.setdefault("record_database", "rec/159.json")
    settings.setdefault("record_id", "163")
    options = resolve_options(settings)
    out = io.StringIO()
    seen = {}

    def factory(o, d, compile_ahead):
        seen["options"] = o
        return executor

    rc = run_tune(options, executor_factory=factory, instance_loader=loader, out=out, is_tty=False)
    return rc, seen["options"], out.getvalue()


def records(tmp_path):
    return [json.loads(line) for line in (tmp_path / "run" / "trials.jsonl").read_text().splitlines()]


def read(tmp_path, name):
    return json.loads((tmp_path / "run" / name).read_text())


# -- options ----------------------------------------------------------------------------------------------
def test_metrics_and_counter_objectives_resolve():
    o = resolve_options({"record_database": "a.json", "metrics": ["dram_bytes,l2_hit_rate", "dram_bytes"]})
    assert o.metrics == ["dram_bytes", "l2_hit_rate"] and o.counters == ("dram_bytes", "l2_hit_rate")
    assert o.directions == ("minimize",) and o.to_dict()["metrics"] == ["dram_bytes", "l2_hit_rate"]
    o = resolve_options({"record_database": "a.json", "objective": "dram_bytes"})
    assert o.counters == ("dram_bytes",) and o.directions == ("minimize",)
    o = resolve_options({"record_database": "a.json", "objective": "achieved_occupancy", "metrics": "l2_hit_rate"})
    assert o.counters == ("l2_hit_rate", "achieved_occupancy") and o.directions == ("maximize",)
    o = resolve_options({"record_database": "a.json", "objective": "lts__t_sectors.sum", "sampler": "nsga2",
                         "trials": 4})
    assert o.directions == ("minimize", "minimize")  # the counter, then the secondary objective (registers)
    o = resolve_options({"record_database": "a.json", "objective": "time,achieved_occupancy", "sampler": "nsga2",
                         "trials": 4})
    assert o.directions == ("minimize", "maximize") and o.counters == ("achieved_occupancy",)
    assert o.objectives.metric_names == ["mean_time_ns", "achieved_occupancy"]
    assert resolve_options({"record_database": "a.json"}).counters == ()


@pytest.mark.parametrize(("settings", "message"), [
    ({"objective": "sm_throughput"}, "is not better when lower or higher"),
    ({"objective": "dram_byte"}, "close names: dram_bytes"),
    ({"objective": "warp_stalls"}, "give one metric"),
    ({"objective": "dram_bytes", "pruner": "median"}, "--objective dram_bytes is measured once per configuration"),
    ({"objective": "time,dram_bytes"}, "multi-objective search: use --sampler nsga2"),
    ({"metrics": "dram_bytes,occupancy"}, "--metrics occupancy: not a metric mneme knows"),
])  # fmt: skip
def test_bad_metric_settings_say_what_to_change(settings, message):
    with pytest.raises(ConfigurationError, match=message):
        resolve_options({"record_database": "a.json", **settings})


def test_the_flags_reach_the_options(tmp_path, monkeypatch, kernel):
    made = []

    def make_executor(options, results_dir, compile_ahead):
        made.append(options)
        return FakeExecutor(metrics=options.counters)

    monkeypatch.setattr(tuner.run, "default_executor", make_executor)
    monkeypatch.setattr(tuner.run, "load_instance",
                        lambda db, rid: (kernel, KernelIdentity("vecAdd", "15941914485064662553", rid)))
    assert main(["tune", "-rdb", "rec/1.json", "-rid", "163", "--space-preset", "launch", "--launch-dim", "x",
                 "--metrics", "dram_bytes,l2_hit_rate", "--metrics", "instructions", "--objective",
                 "achieved_occupancy", "--results-dir", str(tmp_path / "r"), "--quiet"]) == 0
    assert made[0].counters == ("dram_bytes", "l2_hit_rate", "instructions", "achieved_occupancy")
    assert json.loads((tmp_path / "r" / "config.json").read_text())["metrics"] == [
        "dram_bytes", "l2_hit_rate", "instructions"]
    assert main(["tune", "-rdb", "rec/1.json", "--objective", "bogus_metric"]) == 2


def test_the_real_executor_asks_the_servers_for_the_counters(tmp_path, monkeypatch):
    import replay_server.client.executor

    made = {}
    monkeypatch.setattr(replay_server.client.executor, "AsyncReplayExecutor", lambda *a, **kw: made.update(kw))
    default_executor(resolve_options({"record_database": "rec/159.json", "metrics": "l2_hit_rate",
                                      "objective": "dram_bytes"}), tmp_path, [], local_servers=object())
    assert made["metrics"] == ("l2_hit_rate", "dram_bytes")
    made.clear()
    default_executor(resolve_options({"record_database": "rec/159.json"}), tmp_path, [], local_servers=object())
    assert "metrics" not in made  # a run without counters asks for none


# -- runs -------------------------------------------------------------------------------------------------
def test_every_trial_records_its_counters_and_time_still_ranks(tmp_path, loader):
    rc, o, out = tune(tmp_path, loader, FakeExecutor(metrics=("dram_bytes", "l2_hit_rate")),
                      metrics="dram_bytes,l2_hit_rate", **LAUNCH)
    assert rc == 0
    verified = [r for r in records(tmp_path) if r["verified"]]
    for r in verified:
        block = r["configuration"]["block"]
        from mneme.model.experiment import ExperimentConfiguration

        expected = model_counters(ExperimentConfiguration.from_dict(r["configuration"]), ["dram_bytes", "l2_hit_rate"])
        assert r["metrics"] == expected == r["result"]["metrics"], block
    best = read(tmp_path, "best.json")["best"]
    assert best["metric"] == min(r["metric"] for r in verified)  # time ranks: counters are recorded only
    assert best["metrics"] == next(r["metrics"] for r in verified if r["trial"] == best["trial"])
    assert read(tmp_path, "baseline.json")["result"]["metrics"]["dram_bytes"] > 0
    assert "baseline counters: dram_bytes=" in out


def test_a_counter_objective_ranks_and_exports_by_the_counter(tmp_path, loader):
    rc, o, out = tune(tmp_path, loader, FakeExecutor(metrics=("dram_bytes",)), objective="dram_bytes", **LAUNCH)
    assert rc == 0
    verified = [r for r in records(tmp_path) if r["verified"]]
    assert all(r["objective_values"] == [r["metrics"]["dram_bytes"]] for r in verified)
    best = read(tmp_path, "best.json")["best"]
    least = min(verified, key=lambda r: r["metrics"]["dram_bytes"])
    fastest = min(verified, key=lambda r: r["metric"])
    assert best["trial"] == least["trial"] != fastest["trial"]
    assert best["configuration"]["block"]["x"] == 512  # model_counters' least DRAM traffic
    assert read(tmp_path, "summary.json")["best_trial"] == least["trial"]
    export = read(tmp_path, "proteus_tuned_kernels.json")
    assert export["kernels"][0]["configuration"] == best["configuration"]
    assert "results: " in out  # where the results are, at the end


def test_a_maximized_counter_ranks_highest_first(tmp_path, loader):
    rc, o, out = tune(tmp_path, loader, FakeExecutor(metrics=("achieved_occupancy",)), objective="achieved_occupancy",
                      **LAUNCH)
    assert rc == 0 and o.directions == ("maximize",)
    best = read(tmp_path, "best.json")["best"]
    assert best["configuration"]["block"]["x"] == 256 and best["objective_values"] == [90.0]


def test_a_trial_without_its_counter_is_told_as_a_failure(tmp_path, loader):
    missing = lambda config: "hardware counters cannot be collected: busy" if config.block.x == 512 else ""  # noqa: E731
    rc, o, out = tune(tmp_path, loader, FakeExecutor(metrics=("dram_bytes",), metrics_error=missing),
                      objective="dram_bytes", **LAUNCH)
    assert rc == 0
    (lost,) = [r for r in records(tmp_path) if r["configuration"]["block"]["x"] == 512]
    assert lost["status"] == "internal_error" and lost["objective_values"] is None  # as energy not measured is
    assert lost["metrics_error"] == "hardware counters cannot be collected: busy"
    assert lost["error"] == "the replay did not collect the hardware counter dram_bytes: " + lost["metrics_error"]
    assert "metrics" not in lost and lost["result"]["verified"]
    assert read(tmp_path, "best.json")["best"]["trial"] != lost["trial"]


def test_a_pareto_front_of_time_and_a_counter(tmp_path, loader):
    rc, o, out = tune(tmp_path, loader, FakeExecutor(metrics=("dram_bytes",)), objective="time,dram_bytes",
                      sampler="nsga2", trials=24, seed=3, **LAUNCH)
    assert rc == 0
    best = read(tmp_path, "best.json")
    assert best["objectives"] == ["mean_time_ns", "dram_bytes"] and best["pareto_front"]
    verified = [r for r in records(tmp_path) if r["verified"]]
    assert all(r["objective_values"] == [r["metric"], r["metrics"]["dram_bytes"]] for r in verified)


def test_a_baseline_without_the_objectives_counter_stops_the_run(tmp_path, loader):
    refused = lambda config: "hardware counters cannot be collected: the NVIDIA driver lets only administrators"  # noqa: E731
    with pytest.raises(NotAvailableError, match=r"--objective dram_bytes needs the hardware counter dram_bytes, and "
                                                r"the baseline's replay collected none: hardware counters cannot be "
                                                r"collected: the NVIDIA driver"):
        tune(tmp_path, loader, FakeExecutor(metrics=("dram_bytes",), metrics_error=refused), objective="dram_bytes",
             **LAUNCH)


def test_recorded_counters_that_fail_do_not_stop_a_time_run(tmp_path, loader):
    refused = lambda config: "hardware counters cannot be collected: busy"  # noqa: E731
    rc, o, out = tune(tmp_path, loader, FakeExecutor(metrics=("dram_bytes",), metrics_error=refused),
                      metrics="dram_bytes", **LAUNCH)
    assert rc == 0 and "note: hardware counters: hardware counters cannot be collected: busy" in out
    assert all(r["metrics_error"] for r in records(tmp_path) if r["verified"])


def test_rank_values():
    record = {"metric": 5.0, "objective_values": [40.0]}
    assert rank_value(record) == 5.0 and rank_value(record, "speedup") == 5.0
    assert rank_value(record, "dram_bytes") == 40.0 and rank_value(record, "l2_hit_rate") == -40.0
    assert rank_value({"metric": 5.0, "objective_values": None}, "dram_bytes") == float("inf")
    assert Objective(objective="dram_bytes").rank_value(record) == 40.0
