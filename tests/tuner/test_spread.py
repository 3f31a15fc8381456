"""The spread of the measured launches in best.json and summary.json: std, a seeded bootstrap confidence
interval of the metric, and the flag for a best the baseline's interval overlaps; throttled trials counted."""

from __future__ import annotations

import io
import json
import statistics

import pytest

from tuner.options import resolve_options
from tuner.results.spread import measured_times, overlaps, result_spread, spread
from tuner.results.summary import best_document
from tuner.run import run_tune
from tuner.testing import EnergyExecutor, FakeExecutor


def test_std_and_interval_of_the_mean():
    times = [1000, 1010, 990, 1005, 995, 1002, 998]
    s = spread(times, "mean")
    assert s["launches"] == 7 and s["std_ns"] == pytest.approx(statistics.stdev(times))
    low, high = s["ci_ns"]
    assert low < statistics.fmean(times) < high and high - low < 20
    assert s["confidence"] == 0.95 and s["resamples"] == 2000 and s["metric"] == "mean"


def test_the_interval_is_the_same_every_time_seeded():
    times = [5.5, 9.1, 2.3, 7.7, 7.2, 3.9, 8.4, 1.6, 6.05]
    assert spread(times, "mean") == spread(times, "mean")
    assert spread(times, "mean", seed=1)["ci_ns"] != spread(times, "mean", seed=0)["ci_ns"]


@pytest.mark.parametrize("metric", ["mean", "median", "min", "max"])
def test_the_interval_lies_within_the_launches(metric):
    times = [100, 120, 110, 130, 105]
    low, high = spread(times, metric)["ci_ns"]
    assert min(times) <= low <= high <= max(times)


def test_one_launch_has_no_spread():
    s = spread([1234], "mean")
    assert s["launches"] == 1 and s["std_ns"] is None and s["ci_ns"] is None
    assert overlaps(s, spread([1, 2, 3], "mean")) is None


def test_many_launches_are_resampled_in_chunks(monkeypatch):
    import tuner.results.spread as mod

    monkeypatch.setattr(mod, "CHUNK_VALUES", 1000)
    times = list(range(1, 501))
    s = spread(times, "mean", resamples=100)
    assert s["ci_ns"][0] < 250.5 < s["ci_ns"][1]


def test_overlap():
    a, b = {"ci_ns": [10.0, 20.0]}, {"ci_ns": [19.0, 30.0]}
    assert overlaps(a, b) and overlaps(b, a)
    assert not overlaps(a, {"ci_ns": [20.5, 25.0]})
    assert overlaps(a, None) is None


def test_measured_times_skip_the_warmups():
    assert measured_times({"exec_time": [9, 9, 1, 2], "warmup": 2}) == [1, 2]
    assert result_spread({"exec_time": [], "warmup": 0}, "mean") is None


def _record(trial, times, warmup=1, metric=None):
    measured = times[warmup:]
    return {"trial": trial, "status": "verified", "hash": f"h{trial}", "params": {}, "configuration": {},
            "metric": metric or statistics.fmean(measured), "objective_values": [statistics.fmean(measured)],
            "result": {"exec_time": times, "warmup": warmup}}


def test_best_flags_an_interval_that_overlaps_the_baselines():
    baseline = {"metric": 1000.0, "metric_name": "mean", "result": {"exec_time": [0, 990, 1010, 1000, 995, 1005],
                                                                     "warmup": 1}}
    close = _record(0, [0, 985, 1005, 995, 990, 1000])  # 0.5% faster, noise of 1%
    doc = best_document([close], baseline, False)
    assert doc["best"]["overlaps_baseline"] is True
    assert doc["best"]["spread"]["launches"] == 5 and doc["baseline_spread"]["launches"] == 5
    far = _record(1, [0, 500, 505, 495, 502, 498])
    assert best_document([far], baseline, False)["best"]["overlaps_baseline"] is False


def test_run_outputs_carry_the_spread_and_the_throttled_trials(tmp_path, loader):
    options = resolve_options({"record_database": "rec/159.json", "record_id": "163", "space_preset": "launch",
                               "launch_dim": "x", "launch_safety": "aggressive", "fixed_codegen_opt": 3,
                               "results_dir": str(tmp_path / "run")})
    executor = EnergyExecutor(throttled_x=512)  # its results carry conditions (a time run ignores the energy)
    out = io.StringIO()
    rc = run_tune(options, executor_factory=lambda o, d, c: executor, instance_loader=loader, out=out, is_tty=False)
    assert rc == 0
    run = tmp_path / "run"
    best = json.loads((run / "best.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    baseline = json.loads((run / "baseline.json").read_text())
    assert best["best"]["spread"]["ci_ns"] and best["baseline_spread"]["ci_ns"]
    assert isinstance(best["best"]["overlaps_baseline"], bool)
    assert summary["best_spread"] == best["best"]["spread"] and summary["baseline_spread"] == best["baseline_spread"]
    assert summary["best_overlaps_baseline"] == best["best"]["overlaps_baseline"]
    throttled = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    throttled = [r for r in throttled if (r["result"].get("conditions") or {}).get("throttled")]
    assert throttled and summary["throttled_trials"] == len(throttled) and not summary["baseline_throttled"]
    assert "measured while the GPU throttled" in out.getvalue()
    assert baseline["conditions"]["before"]["sm_clock_mhz"] == 1980 and baseline["throttled"] is False


def test_a_plain_time_run_keeps_its_outputs_and_adds_the_spread(tmp_path, loader):
    options = resolve_options({"record_database": "rec/159.json", "record_id": "163", "space_preset": "quick",
                               "results_dir": str(tmp_path / "run")})
    rc = run_tune(options, executor_factory=lambda o, d, c: FakeExecutor(), instance_loader=loader,
                  out=io.StringIO(), is_tty=False)
    assert rc == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["throttled_trials"] == 0 and "best_energy_j" not in summary
    # FakeExecutor's launches grow by 500 ns each: a real spread, and an interval
    assert summary["best_spread"]["std_ns"] > 0 and summary["best_spread"]["ci_ns"][0] < summary["best_metric"]
