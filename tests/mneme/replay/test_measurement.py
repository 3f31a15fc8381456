"""What a replay measures besides times, on the CPU: the energy window's arithmetic and its loop, the
conditions around the launches, and a Replayer (fake engine, fake NVML) reporting both."""

from __future__ import annotations

import json

import pytest
from test_replayer_runs import kernel  # noqa: F401  (the fake engine's kernel: a pytest fixture)

import mneme.testing.synthetic_recordings as synth
from mneme._internal import nvml
from mneme.errors import ConfigurationError, NotAvailableError
from mneme.model.experiment import ExperimentResult
from mneme.model.measurement import DEFAULT_MEASUREMENT, MAX_ENERGY_WINDOW_S, MeasurementSettings
from mneme.recording.execution import RecordedExecution
from mneme.replay import measurement as meas
from mneme.replay.measurement import EnergyReading, Measurer, energy_from_samples, energy_window
from mneme.testing.fake_nvml import install


# -- the settings ------------------------------------------------------------------------------------------
def test_settings_defaults_key_and_dict_round_trip():
    settings = MeasurementSettings(energy=True, energy_window_s=0.25, conditions_max_age_s=0)
    assert MeasurementSettings.from_dict(settings.to_dict()) == settings
    assert MeasurementSettings.from_dict(json.loads(settings.key())) == settings
    assert MeasurementSettings().key() == DEFAULT_MEASUREMENT and not MeasurementSettings().energy
    assert settings.with_(energy=False).energy_window_s == 0.25


@pytest.mark.parametrize("fields, message", [
    ({"energy_window_s": 0.001}, "0.01 to 2 seconds"),
    ({"energy_window_s": MAX_ENERGY_WINDOW_S + 1}, "0.01 to 2 seconds"),
    ({"energy_window_s": float("nan")}, "number of seconds"),
    ({"energy": "yes"}, "true or false"),
    ({"conditions_max_age_s": -1}, "0 or more"),
])
def test_bad_settings_are_refused(fields, message):
    with pytest.raises(ConfigurationError, match=message):
        MeasurementSettings(**fields)
    with pytest.raises(ConfigurationError, match="unknown field"):
        MeasurementSettings.from_dict({"energy_windows": 1})


# -- the energy window's arithmetic -------------------------------------------------------------------------
def test_energy_between_the_counters_first_and_last_step():
    # 10 batches of 100 launches, each 10 ms: 1 kW-ish counter stepping every 25 ms by 5 J (200 W).
    spans = [(i * 0.010, (i + 1) * 0.010, 100) for i in range(10)]
    samples = [(-0.001, 1_000_000)] + [(0.020 + 0.025 * k, 1_000_000 + 5000 * (k + 1)) for k in range(4)]
    reading = energy_from_samples(samples, spans)
    # steps at 0.020 and 0.095: 15 J over 75 ms = 200 W; 750 launches ran in between: 20 mJ each
    assert reading.power_w == pytest.approx(200.0)
    assert reading.energy_j == pytest.approx(15.0 / 750)
    assert reading.details == {"window_s": 0.075, "launches": 750.0, "counter_steps": 4, "batches": 10,
                               "launches_run": 1000}


def test_steps_outside_the_launches_do_not_count():
    spans = [(1.0, 1.1, 1000)]
    samples = [(0.9, 0), (0.95, 500), (1.02, 1000), (1.08, 2200), (1.2, 9000)]
    reading = energy_from_samples(samples, spans)
    assert reading.power_w == pytest.approx(1.2 / 0.06) and reading.details["counter_steps"] == 2
    assert reading.energy_j == pytest.approx(1.2 / 600)


@pytest.mark.parametrize("samples, message", [
    ([(0.0, 5)], "stepped 0 time"),
    ([(0.0, 5), (0.05, 10)], "stepped 1 time"),
    ([(0.0, 5), (0.02, 10), (0.05, 8)], "went backwards"),
])
def test_too_few_steps_or_a_counter_going_back_measures_nothing(samples, message):
    reading = energy_from_samples(samples, [(0.0, 0.1, 10)])
    assert reading.energy_j == -1 and reading.power_w == -1 and message in reading.details["error"]


def test_batches_are_about_twenty_milliseconds_and_bounded():
    assert meas.batch_launches(1e-6) == meas.MAX_BATCH_LAUNCHES
    assert meas.batch_launches(1e-3) == 20
    assert meas.batch_launches(1.0) == 1 and meas.batch_launches(0.0) == 1
    assert meas.window_limit(0.1) == 0.5 and meas.window_limit(0.3) == pytest.approx(1.2)
    assert meas.window_limit(1.0) == MAX_ENERGY_WINDOW_S


class FakeGpu:
    """A counter stepping every ``step_s`` of a fake clock at ``power_w``; each launch takes ``launch_s``."""

    def __init__(self, power_w=300.0, step_s=0.01, launch_s=0.0005):
        self.now, self.power_w, self.step_s, self.launch_s = 0.0, power_w, step_s, launch_s
        self.launched = 0

    def clock(self):
        return self.now

    def read_mj(self):
        return int(self.now / self.step_s) * int(self.step_s * self.power_w * 1000)

    def run(self, launches):
        self.launched += launches
        self.now += launches * self.launch_s


def test_the_window_runs_until_long_enough_and_the_counter_stepped(monkeypatch):
    gpu = FakeGpu()

    class SyncPoller(meas.CounterPoller):  # reads the counter after each batch instead of on a thread
        def start(self):
            self.samples = [(self._clock(), self._read())]

        def steps_since(self, since):
            value = self._read()
            if value != self.samples[-1][1]:
                self.samples.append((self._clock(), value))
            return super().steps_since(since)

        def stop(self):
            pass

    monkeypatch.setattr(meas, "CounterPoller", SyncPoller)
    reading = energy_window(gpu.run, gpu.launch_s, gpu.read_mj, 0.1, clock=gpu.clock)
    assert reading.power_w == pytest.approx(300.0, rel=0.01)
    assert reading.energy_j == pytest.approx(300.0 * gpu.launch_s, rel=0.01)
    assert 0.1 <= gpu.now <= 0.15 and reading.details["batches"] == gpu.launched // 40


def test_a_counter_that_never_steps_stops_at_the_limit_and_says_so(monkeypatch):
    gpu = FakeGpu()
    reading = energy_window(gpu.run, gpu.launch_s, lambda: 42, 0.1, clock=gpu.clock, poll_s=0.0001)
    assert reading.energy_j == -1 and "stepped 0 time" in reading.details["error"]
    assert gpu.now >= meas.window_limit(0.1)


def test_the_poller_thread_sees_a_real_counter(monkeypatch):
    """Real time: a fake NVML counter stepping every 5 ms at 250 W, launches that sleep."""
    import time

    fake = install(monkeypatch)
    device = nvml.cuda_device()
    reading = energy_window(lambda n: time.sleep(n * 0.0002), 0.0002, device.energy_mj, 0.06)
    assert reading.power_w == pytest.approx(fake.power_w, rel=0.25)
    assert reading.energy_j == pytest.approx(fake.power_w * 0.0002, rel=0.3)
    assert reading.details["counter_steps"] >= meas.MIN_COUNTER_STEPS


def test_a_counter_failing_mid_window_says_why():
    calls = iter([5, 5])

    def read():
        value = next(calls, None)
        if value is None:
            raise NotAvailableError("reading it failed: GPU is lost")
        return value

    reading = energy_window(lambda n: None, 0.001, read, 0.05, poll_s=0.0005)
    assert reading.energy_j == -1 and "GPU is lost" in reading.details["error"]


# -- conditions around the launches ------------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_conditions_before_and_after_and_throttling(monkeypatch):
    fake = install(monkeypatch)
    clock = Clock()
    measurer = Measurer(0, MeasurementSettings(conditions_max_age_s=0.05), clock=clock)
    before = measurer.before()
    fake.reasons, fake.sm_clock = 0x4, 1410  # the power cap bit while it ran
    clock.now += 0.2
    conditions = measurer.after(before)
    assert conditions["before"]["sm_clock_mhz"] == 1980 and conditions["before"]["age_s"] == 0.0
    assert conditions["after"]["sm_clock_mhz"] == 1410 and "age_s" not in conditions["after"]
    assert conditions["throttled"] and conditions["throttle_reasons"] == ["sw_power_cap"]


def test_a_young_reading_is_reused_so_short_replays_pay_no_nvml_calls(monkeypatch):
    fake = install(monkeypatch)
    clock = Clock()
    measurer = Measurer(0, MeasurementSettings(conditions_max_age_s=0.05), clock=clock)
    measurer.after(measurer.before())
    reads = len(fake.called("nvmlDeviceGetClockInfo"))
    for _ in range(10):  # ten replays of 1 ms: one reading serves them all
        before = measurer.before()
        clock.now += 0.001
        conditions = measurer.after(before)
        assert "after" not in conditions and not conditions["throttled"]
    assert len(fake.called("nvmlDeviceGetClockInfo")) == reads
    assert conditions["before"]["age_s"] == pytest.approx(0.009)
    clock.now += 0.05
    assert measurer.after(measurer.before())["before"]["age_s"] == 0.0  # too old: read again
    assert len(fake.called("nvmlDeviceGetClockInfo")) == reads + 2


def test_max_age_zero_reads_before_and_after_every_replay(monkeypatch):
    fake = install(monkeypatch)
    measurer = Measurer(0, MeasurementSettings(conditions_max_age_s=0), clock=Clock())
    for _ in range(3):
        assert "after" in measurer.after(measurer.before())
    assert len(fake.called("nvmlDeviceGetCurrentClocksEventReasons")) == 6


def test_without_nvml_the_conditions_say_why_once(monkeypatch, caplog):
    fake = install(monkeypatch)
    fake.fail["nvmlInit"] = 12
    measurer = Measurer(0)
    with caplog.at_level("WARNING", logger="mneme.nvml"):
        first = measurer.after(measurer.before())
        second = Measurer(0).after(Measurer(0).before())
    assert first == second == {"unavailable": "NVML did not initialize: NVML Shared Library Not Found (NVML error 12)"}
    assert len([r for r in caplog.records if "conditions are not recorded" in r.getMessage()]) == 1
    reading = measurer.energy(lambda n: None, 0.001)
    assert reading.energy_j == -1 and "NVML Shared Library Not Found" in reading.details["error"]


def test_a_gpu_without_an_energy_counter_measures_no_energy_and_runs_no_window(monkeypatch):
    fake = install(monkeypatch)
    fake.fail["nvmlDeviceGetTotalEnergyConsumption"] = 3
    ran = []
    reading = Measurer(0, MeasurementSettings(energy=True)).energy(ran.append, 0.001)
    assert reading == EnergyReading.unmeasured(reading.details["error"]) and "no energy counter" in reading.details["error"]
    assert ran == []


# -- a Replayer reports them --------------------------------------------------------------------------------
def _replayer(tmp_path, **options):
    from mneme.replay import Replayer

    db = synth.vecadd(tmp_path / "rec", n=4096, block=256)
    rec = RecordedExecution.from_json(str(db))
    return Replayer(rec, rec.single_instance().record_id, **options)


def test_a_replay_with_energy_runs_the_window_after_its_verified_launches(kernel, monkeypatch, tmp_path):
    fake = install(monkeypatch)
    fake.energy_step_s = 0.002
    with _replayer(tmp_path, measurement=MeasurementSettings(energy=True, energy_window_s=0.02)) as replayer:
        config = replayer.baseline()
        result = replayer.run(config, iterations=3, warmup=1)
        assert result.verified and result.energy_j > 0 and result.power_w > 0, result.conditions
        assert result.conditions["before"]["sm_clock_mhz"] == 1980 and not result.conditions["throttled"]
        assert result.conditions["energy"]["counter_steps"] >= 2
        window = [r for r in kernel.runs if not r.check_launches and not r.from_recorded]
        assert window and all(r.queue_ahead_ns == 0 and not r.checks for r in window)  # no comparisons in it
        timed = [r for r in kernel.runs if r.check_launches]
        assert timed[-1].launches == 4  # the timed launches are the replay's own, as without energy
        assert ExperimentResult.from_dict(result.to_dict()) == result


def test_a_replay_without_energy_runs_no_window_but_records_conditions(kernel, monkeypatch, tmp_path):
    install(monkeypatch)
    with _replayer(tmp_path) as replayer:
        result = replayer.run(replayer.baseline(), iterations=3, warmup=1)
        assert result.verified and result.energy_j == -1 and result.power_w == -1
        assert "before" in result.conditions and "energy" not in result.conditions
        assert all(r.check_launches for r in kernel.runs)  # the proof's launches and the replay's own: no window


def test_a_replay_that_fails_verification_runs_no_window(kernel, monkeypatch, tmp_path):
    install(monkeypatch)
    kernel.differs = lambda run, launch, check: 3 if check == 2 and run.check_launches else 0
    with _replayer(tmp_path, measurement=MeasurementSettings(energy=True)) as replayer:
        result = replayer.run(replayer.baseline(), iterations=2, warmup=0)
    assert not result.verified and result.energy_j == -1 and "energy" not in result.conditions


def test_a_replay_where_nvml_is_missing_says_why_in_its_result(kernel, monkeypatch, tmp_path):
    fake = install(monkeypatch)
    fake.fail["nvmlInit"] = 12
    with _replayer(tmp_path, measurement=MeasurementSettings(energy=True)) as replayer:
        result = replayer.run(replayer.baseline(), iterations=2, warmup=0)
    assert result.verified and result.energy_j == -1 and result.power_w == -1
    assert "NVML Shared Library Not Found" in result.conditions["unavailable"]
    assert "NVML Shared Library Not Found" in result.conditions["energy"]["error"]


# -- mneme replay --energy ----------------------------------------------------------------------------------
def test_replay_energy_flags_and_the_notes_it_prints():
    from mneme.cli import build_parser
    from mneme.cli.replay import measurement_notes

    args = build_parser().parse_args(["replay", "-rdb", "x.json", "--energy", "--energy-window", "0.3"])
    assert args.energy and args.energy_window == 0.3
    assert not build_parser().parse_args(["replay", "-rdb", "x.json"]).energy
    throttled = ExperimentResult(verified=True, energy_j=0.1, power_w=200.0,
                                 conditions={"throttled": True, "throttle_reasons": ["hw_thermal_slowdown"]})
    assert measurement_notes(throttled, True) == [
        "measured while the GPU throttled (hw_thermal_slowdown): the times may be slower than the GPU's usual "
        "(conditions in the result)"]
    missing = ExperimentResult(verified=True, conditions={"unavailable": "NVML did not initialize: x"})
    assert measurement_notes(missing, True) == ["energy not measured: NVML did not initialize: x"]
    assert measurement_notes(missing, False) == []


def test_replay_refuses_a_bad_energy_window(tmp_path):
    from mneme.cli import main

    db = synth.vecadd(tmp_path / "rec", n=1024, block=256)
    assert main(["replay", "-rdb", str(db), "--energy", "--energy-window", "5"]) == 2
