"""``mneme tune --objective energy|edp|time,energy``: what the replays are asked to measure, what the sampler
is told, the best and the Pareto front, the refusal where nothing measures energy, and ``--lock-clocks``."""

from __future__ import annotations

import io
import json

import pytest

import tuner.run
from mneme.cli import main
from mneme.errors import ConfigurationError, NotAvailableError
from mneme.model.experiment import ExperimentResult
from mneme.model.measurement import MeasurementSettings
from tuner.objective import Objective, needs_energy, objective_errors, objective_names
from tuner.options import resolve_options
from tuner.recording import KernelIdentity
from tuner.run import run_tune
from tuner.testing import EnergyExecutor

BASE = {"record_database": "rec/159.json", "record_id": "163", "space_preset": "launch", "launch_dim": "x",
        "launch_safety": "aggressive", "fixed_codegen_opt": 3}


def tune(tmp_path, loader, executor, **settings):
    settings = {**BASE, "results_dir": str(tmp_path / "run"), **settings}
    options = resolve_options(settings)
    seen = []

    def factory(o, d, compile_ahead):
        seen.append(o)
        return executor

    out = io.StringIO()
    rc = run_tune(options, executor_factory=factory, instance_loader=loader, out=out, is_tty=False)
    return rc, seen[0] if seen else None, out.getvalue()


def read(tmp_path, name):
    return json.loads((tmp_path / "run" / name).read_text())


def trials(tmp_path):
    return [json.loads(line) for line in (tmp_path / "run" / "trials.jsonl").read_text().splitlines()]


# -- the objective ------------------------------------------------------------------------------------------
def test_objective_names_directions_and_metric_names():
    assert objective_names(" Time , ENERGY ") == ("time", "energy")
    assert Objective("median", "time,energy").directions == ("minimize", "minimize")
    assert Objective("median", "time,energy").metric_names == ["median_time_ns", "energy_j_per_launch"]
    assert Objective("mean", "energy", "registers").names == ("energy", "registers")
    assert Objective("mean", "edp").metric_names == ["edp_j_s_mean"]
    assert Objective("mean", "speedup", "binary-size").directions == ("maximize", "minimize")
    assert Objective("min", "time", "registers").metric_names == ["min_time_ns", "registers"]  # as before
    assert needs_energy("time,edp") and needs_energy("energy") and not needs_energy("speedup")


@pytest.mark.parametrize("objective, message", [
    ("power", "choose one of time, speedup, energy, edp"),
    ("time,speedup", "combines time, energy, edp"),
    ("time,time", "twice"),
    ("", "name one of"),
])
def test_bad_objectives_are_refused(objective, message):
    assert message in objective_errors(objective)[0]


def test_values_told_for_each_objective():
    result = ExperimentResult(exec_time=[900, 1000, 1000, 1000], warmup=1, verified=True, executed=True,
                              status="verified", energy_j=0.25, power_w=250.0, reg_usage=32)
    assert Objective("mean", "energy").evaluate(result).values == (0.25,)
    assert Objective("mean", "edp").evaluate(result).values == pytest.approx((0.25 * 1000e-9,))
    outcome = Objective("mean", "time,energy").evaluate(result)
    assert outcome.values == (1000.0, 0.25) and outcome.metric == 1000.0
    assert Objective("mean", "energy", "registers").evaluate(result).values == (0.25, 32.0)
    assert Objective("mean", "energy").evaluate(result).running == ()  # nothing per launch to prune on


def test_a_verified_result_without_energy_fails_the_energy_objective_with_the_reason():
    result = ExperimentResult(exec_time=[1000], verified=True, executed=True, status="verified",
                              conditions={"energy": {"error": "NVML's energy counter stepped 1 time(s)"}})
    outcome = Objective("mean", "energy").evaluate(result)
    assert outcome.values is None and outcome.status == "internal_error"
    assert outcome.reason == "the replay did not measure energy: NVML's energy counter stepped 1 time(s)"
    assert Objective("mean", "time").evaluate(result).values == (1000.0,)  # time needs none


# -- options ------------------------------------------------------------------------------------------------
def test_energy_objectives_ask_the_replays_for_an_energy_window():
    options = resolve_options({**BASE, "objective": "energy", "energy_window": 0.25})
    assert options.measurement == MeasurementSettings(energy=True, energy_window_s=0.25)
    assert resolve_options(BASE).measurement == MeasurementSettings()
    assert resolve_options({**BASE, "objective": ["time", "energy"], "sampler": "nsga2", "trials": 4}).objective \
        == "time,energy"


@pytest.mark.parametrize("settings, message", [
    ({"objective": "time,energy"}, "multi-objective search: use --sampler nsga2"),
    ({"objective": "time,energy", "sampler": "nsga2", "trials": 4, "secondary_objective": "binary-size"},
     "names its objectives already"),
    ({"objective": "energy", "sampler": "tpe", "trials": 4, "pruner": "median"}, "drop --pruner"),
    ({"objective": "energy", "energy_window": 9}, "--energy-window"),
    ({"objective": "watts"}, "--objective 'watts'"),
    ({"lock_clocks": "max", "servers": ["h:1"]}, "mneme serve --lock-clocks"),
    ({"lock_clocks": "max", "keep_servers": 600}, "drop one of them"),
])
def test_contradictions_are_refused(settings, message):
    with pytest.raises(ConfigurationError, match=message):
        resolve_options({**BASE, **settings})


def test_lock_clocks_goes_to_the_local_servers_and_into_config_json():
    options = resolve_options({**BASE, "lock_clocks": "base"})
    assert options.connection.lock_clocks == "base" and options.connection.local_server_args() == ["--lock-clocks", "base"]
    assert options.to_dict()["lock_clocks"] == "base" and options.to_dict()["energy_window"] == 0.1


def test_kept_servers_are_not_reused_with_locked_clocks(monkeypatch):
    import replay_server.client.reuse

    monkeypatch.setattr(replay_server.client.reuse, "find_reusable", lambda *a, **k: pytest.fail("looked for kept"))
    assert tuner.run._reusable_servers(resolve_options({**BASE, "lock_clocks": "max"})) is None


# -- runs ---------------------------------------------------------------------------------------------------
def test_energy_run_ranks_by_joules_per_launch(tmp_path, loader):
    rc, options, out = tune(tmp_path, loader, EnergyExecutor(), objective="energy")
    assert rc == 0 and options.measurement.energy
    records = [r for r in trials(tmp_path) if r["status"] == "verified"]
    best = read(tmp_path, "best.json")["best"]
    assert best["energy_j"] == min(r["objective_values"][0] for r in records)
    assert best["energy_j"] == best["objective_values"][0] and best["power_w"] > 0
    fastest = min(records, key=lambda r: r["metric"])
    assert best["hash"] != fastest["hash"]  # the most frugal is not the fastest here
    summary = read(tmp_path, "summary.json")
    assert summary["best_energy_j"] == best["energy_j"] and summary["baseline_energy_j"] > 0
    assert "J per launch at" in out and "energy=" in (tmp_path / "run" / "logs" / "tune.log").read_text()


def test_edp_run_ranks_by_energy_times_delay(tmp_path, loader):
    rc, _, _ = tune(tmp_path, loader, EnergyExecutor(), objective="edp")
    assert rc == 0
    records = [r for r in trials(tmp_path) if r["status"] == "verified"]
    for r in records:
        result = r["result"]
        assert r["objective_values"][0] == pytest.approx(result["energy_j"] * r["metric"] * 1e-9)
    best = read(tmp_path, "best.json")["best"]
    assert best["objective_values"][0] == min(r["objective_values"][0] for r in records)


def test_time_and_energy_with_nsga2_give_a_pareto_front(tmp_path, loader):
    rc, options, printed = tune(tmp_path, loader, EnergyExecutor(), objective="time,energy", sampler="nsga2",
                                trials=30, seed=1)
    assert rc == 0 and options.directions == ("minimize", "minimize")
    # The run ends with the front, each point's energy beside its time.
    assert "Pareto front (mean_time_ns, energy_j_per_launch) against the baseline" in printed
    assert "energy_j_per_launch" in printed.split("Pareto front")[1]
    doc = read(tmp_path, "best.json")
    front = doc["pareto_front"]
    assert doc["objectives"] == ["mean_time_ns", "energy_j_per_launch"]
    assert len(front) >= 2
    points = [(p["objective_values"][0], p["objective_values"][1]) for p in front]
    for t, e in points:  # nobody on the front is beaten in both by another verified trial
        assert not any(t2 <= t and e2 <= e and (t2, e2) != (t, e)
                       for r in trials(tmp_path) if r["status"] == "verified"
                       for t2, e2 in [tuple(r["objective_values"])])
    assert all(p["energy_j"] == p["objective_values"][1] for p in front)
    table = printed.split("Pareto front")[1]
    assert all(f"{p['objective_values'][1]:.4g}" in table for p in front)


def test_the_strategy_is_told_both_values_with_metric_names(tmp_path, loader, monkeypatch):
    made = {}
    real = tuner.run.make_strategy

    def spy(space, sampler, **kwargs):
        made.update(kwargs)
        return real(space, sampler, **kwargs)

    monkeypatch.setattr(tuner.run, "make_strategy", spy)
    rc, _, _ = tune(tmp_path, loader, EnergyExecutor(), objective="time,energy", sampler="nsga2", trials=6)
    assert rc == 0 and made["directions"] == ("minimize", "minimize")
    assert all(len(r["objective_values"]) == 2 for r in trials(tmp_path) if r["status"] == "verified")


def test_energy_objective_refused_when_the_replays_measure_none(tmp_path, loader):
    with pytest.raises(Exception) as raised:
        tune(tmp_path, loader, EnergyExecutor(measure_energy=False), objective="energy")
    message = str(raised.value)
    assert "--objective energy needs the GPU's energy" in message and EnergyExecutor.UNAVAILABLE in message
    assert trials(tmp_path) == []  # no trial ranked on nothing


def test_energy_refusal_is_one_error_and_exit_status_2(tmp_path, kernel, monkeypatch, capsys):
    monkeypatch.setattr(tuner.run, "default_executor", lambda o, d, c: EnergyExecutor(measure_energy=False))
    monkeypatch.setattr(tuner.run, "load_instance",
                        lambda db, rid: (kernel, KernelIdentity("vecAdd", "15941914485064662553", rid)))
    rc = main(["tune", "-rdb", "rec/1.json", "-rid", "163", "--objective", "edp", "--space-preset", "launch",
               "--results-dir", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.count("error:") == 1 and "NVML Shared Library Not Found" in err
    assert (tmp_path / "run" / "baseline.json").is_file()  # the baseline says what it measured


def test_time_runs_need_no_energy_and_say_when_nvml_is_missing(tmp_path, loader):
    rc, options, out = tune(tmp_path, loader, EnergyExecutor(measure_energy=False))
    assert rc == 0 and not options.measurement.energy
    assert "the GPU's clocks and temperature are not recorded" in out and out.count("not recorded") == 1


def test_resume_replays_a_baseline_that_has_no_energy(tmp_path, loader):
    with pytest.raises(NotAvailableError, match="measured none"):  # refused at the baseline: no NVML there
        tune(tmp_path, loader, EnergyExecutor(measure_energy=False), space_preset="quick", objective="energy")
    executor = EnergyExecutor()
    rc, _, _ = tune(tmp_path, loader, executor, space_preset="quick", objective="energy", resume=True)
    assert rc == 0 and executor.evaluated == 1  # the earlier baseline measured no energy: replayed again
    assert read(tmp_path, "baseline.json")["result"]["energy_j"] > 0


def test_the_objectives_of_a_results_directory_are_read_back_from_its_config():
    objective = Objective.from_config({"metric": "median", "objective": "time,energy", "sampler": "nsga2",
                                       "secondary_objective": "registers"})
    assert objective.names == ("time", "energy") and objective.directions == ("minimize", "minimize")
    assert Objective.from_config({"objective": "energy", "sampler": "nsga2"}).names == ("energy", "registers")
    assert Objective.from_config({"objective": "speedup", "sampler": "tpe"}).directions == ("maximize",)
    options = resolve_options({**BASE, "objective": "edp", "sampler": "nsga2", "trials": 3,
                               "secondary_objective": "binary-size"})
    assert options.objectives == Objective.from_config(options.to_dict())
    assert options.objectives.metric_names == ["edp_j_s_mean", "binary_size_bytes"]
