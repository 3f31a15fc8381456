"""The model <-> wire converter for what replays measure: the settings travel whole with the instance, and
results carry energy and the GPU's conditions; unmeasured is unset on the wire, never a zero."""

from __future__ import annotations

import dataclasses

import pytest

from mneme.errors import ConfigurationError
from mneme.model.experiment import ExperimentResult
from mneme.model.measurement import DEFAULT_CONDITIONS_MAX_AGE_S, DEFAULT_ENERGY_WINDOW_S, MeasurementSettings
from replay_server.protocol import replay_pb2
from replay_server.protocol.convert import (
    measurement_from_proto,
    measurement_to_proto,
    result_from_proto,
    result_to_proto,
)

READING = {"sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "temperature_c": 44, "power_w": 312.5,
           "clock_event_reasons": ["sw_power_cap"], "age_s": 0.012}


@pytest.mark.parametrize("settings", [
    MeasurementSettings(),
    MeasurementSettings(energy=True, energy_window_s=0.25, conditions_max_age_s=0.0),
    MeasurementSettings(energy=True, conditions_max_age_s=1.5),
])
def test_settings_travel_whole(settings):
    wire = replay_pb2.Measurement.FromString(measurement_to_proto(settings).SerializeToString())
    assert measurement_from_proto(wire) == settings and measurement_from_proto(wire).key() == settings.key()


def test_every_settings_field_has_its_wire_field():
    assert len(dataclasses.fields(MeasurementSettings)) == len(replay_pb2.Measurement.DESCRIPTOR.fields)


def test_zeros_and_unset_are_the_defaults():
    settings = measurement_from_proto(replay_pb2.Measurement())
    assert settings == MeasurementSettings()
    assert settings.energy_window_s == DEFAULT_ENERGY_WINDOW_S and settings.conditions_max_age_s == DEFAULT_CONDITIONS_MAX_AGE_S
    assert measurement_from_proto(replay_pb2.Measurement(conditions_max_age_seconds=0)).conditions_max_age_s == 0


def test_bad_settings_are_refused():
    with pytest.raises(ConfigurationError, match="energy window"):
        measurement_from_proto(replay_pb2.Measurement(energy=True, energy_window_seconds=60))


@pytest.mark.parametrize("result", [
    ExperimentResult(exec_time=[5, 6], energy_j=0.0123, power_w=301.5, conditions={
        "before": READING, "after": {k: v for k, v in READING.items() if k != "age_s"}, "throttled": True,
        "throttle_reasons": ["sw_power_cap"],
        "energy": {"window_s": 0.104, "launches": 8123.5, "counter_steps": 5, "batches": 3, "launches_run": 12288}}),
    ExperimentResult(conditions={"before": {"sm_clock_mhz": 1410, "clock_event_reasons": [], "age_s": 0.0},
                                 "throttled": False, "throttle_reasons": [], "energy": {"error": "no energy counter"}}),
    ExperimentResult(conditions={"unavailable": "NVML did not initialize: NVML Shared Library Not Found"}),
    ExperimentResult(),
])
def test_results_carry_energy_and_conditions_field_for_field(result):
    wire = replay_pb2.Result.FromString(result_to_proto(result).SerializeToString())
    assert result_from_proto(wire) == result


def test_unmeasured_energy_is_unset_on_the_wire_and_minus_one_in_the_model():
    msg = result_to_proto(ExperimentResult(exec_time=[1]))
    assert not msg.HasField("energy_j") and not msg.HasField("power_w") and not msg.HasField("conditions")
    # a server that predates the fields sends none of them: not a measured zero
    old = result_from_proto(replay_pb2.Result(exec_time=[1], verified=True))
    assert old.energy_j == -1 and old.power_w == -1 and old.conditions == {}


def test_a_value_nvml_did_not_give_stays_absent():
    result = ExperimentResult(conditions={"before": {"sm_clock_mhz": 1980, "clock_event_reasons": [], "age_s": 0.0},
                                          "throttled": False, "throttle_reasons": []})
    back = result_from_proto(result_to_proto(result))
    assert "power_w" not in back.conditions["before"] and "temperature_c" not in back.conditions["before"]
