"""The model <-> wire converter: verification settings travel whole, and arrive checked."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mneme.errors import ConfigurationError
from mneme.format.policy import VerifyPolicy
from mneme.model.verification import DEFAULT_RUNS, DEFAULT_SAFETY, VerificationSettings
from mneme.replay.tolerance import judged_overrides
from replay_server.protocol import replay_pb2
from replay_server.protocol.convert import verification_from_proto, verification_to_proto


@pytest.mark.parametrize("settings", [
    VerificationSettings(),
    VerificationSettings(mode="auto", runs=12, safety=2.5, overrides={"acc": "f32:ulp:16", "*": "bitwise"},
                         relocate=False, every_iteration=True),
    VerificationSettings(derived={"acc": "f32:ulp:12"}, relocate=True),
    VerificationSettings(overrides={"0x7f0000000000": {"dtype": "f64", "mode": "absolute", "threshold": 1e-9}}),
])
def test_settings_travel_whole(settings):
    wire = replay_pb2.Verification.FromString(verification_to_proto(settings).SerializeToString())
    assert verification_from_proto(wire) == settings
    assert verification_from_proto(wire).key() == settings.key()


def test_every_settings_field_has_its_wire_field():
    assert {f.name for f in dataclasses.fields(VerificationSettings)} == set(replay_pb2.Verification.DESCRIPTOR.fields_by_name)


def test_zeros_and_empties_are_the_defaults():
    settings = verification_from_proto(replay_pb2.Verification())
    assert settings == VerificationSettings() and settings.runs == DEFAULT_RUNS and settings.safety == DEFAULT_SAFETY
    assert settings.relocate is None  # unset: relocated only where the recorded addresses cannot be had
    assert verification_from_proto(replay_pb2.Verification(relocate=False)).relocate is False


def test_explicit_policies_win_over_the_derived_ones():
    settings = verification_from_proto(replay_pb2.Verification(derived=json.dumps({"acc": "f32:ulp:12"}),
                                                               overrides=json.dumps({"acc": "f64:absolute:1"}), runs=4))
    assert settings.mode == "exact" and settings.runs == 4
    assert judged_overrides(settings).resolve("acc", 0, None)[0] == VerifyPolicy("f64", "absolute", 1.0)
    assert judged_overrides(settings).resolve("out", 0, None)[0] == VerifyPolicy()  # no policy beneath selects it


@pytest.mark.parametrize("fields, message", [
    ({"runs": 1}, "at least 2 runs"),
    ({"mode": "sometimes"}, "use one of exact, auto"),
    ({"safety": 0.5}, "at least 1"),
    ({"overrides": "acc=f32:ulp:1"}, "JSON object"),
    ({"derived": "[1, 2]"}, "object mapping region selectors"),
    ({"overrides": json.dumps({"acc": "f32:sometimes:1"})}, "sometimes"),
    ({"derived": json.dumps({"acc": "f99:ulp:1"})}, "f99"),
])
def test_bad_settings_are_refused(fields, message):
    with pytest.raises(ConfigurationError, match=message):
        verification_from_proto(replay_pb2.Verification(**fields))
