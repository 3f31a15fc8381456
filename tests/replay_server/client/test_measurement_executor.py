"""Measurement settings through AsyncReplayExecutor and real server processes (the test engine): the energy
window is asked for with the instance, and its results come back."""

from __future__ import annotations

import signal

import pytest

from mneme.errors import ConfigurationError
from mneme.model.experiment import ExperimentConfiguration
from mneme.model.measurement import MeasurementSettings
from replay_server.client.executor import AsyncReplayExecutor
from replay_server.testing.fake_engine import FAKE_POWER_W
from replay_server.testing.servers import RECORD_DB, RECORD_ID, start_server, store  # noqa: F401


def config(block_x=64) -> ExperimentConfiguration:
    return ExperimentConfiguration.from_dict({"block": {"x": block_x}})


def test_energy_is_asked_for_with_the_instance_and_comes_back(store, tmp_path):
    server, address = start_server(store, tmp_path / "log")
    try:
        with AsyncReplayExecutor(str(store / RECORD_DB), RECORD_ID, servers=[address],
                                 measurement=MeasurementSettings(energy=True, energy_window_s=0.2)) as executor:
            result = executor.evaluate(config(128))
        with AsyncReplayExecutor(str(store / RECORD_DB), RECORD_ID, servers=[address]) as executor:
            plain = executor.evaluate(config(128))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    assert result.verified and result.power_w == FAKE_POWER_W
    assert result.energy_j == pytest.approx(FAKE_POWER_W * 128e-9)
    assert plain.verified and plain.energy_j == -1 and plain.power_w == -1  # the default: no energy window


def test_measurement_must_be_settings():
    with pytest.raises(ConfigurationError, match="MeasurementSettings"):
        AsyncReplayExecutor("db.json", "1", servers=["127.0.0.1:1"], measurement={"energy": True})
