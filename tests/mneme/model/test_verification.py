"""VerificationSettings: checked on creation, one canonical key, a lossless dict form."""

from __future__ import annotations

import pytest

from mneme.errors import ConfigurationError
from mneme.model.verification import DEFAULT_RUNS, VerificationSettings


def test_defaults_are_exact_and_may_relocate_as_a_fallback():
    settings = VerificationSettings()
    assert (settings.mode, settings.runs, settings.relocate, settings.every_iteration) == \
        ("exact", DEFAULT_RUNS, None, False)


@pytest.mark.parametrize("changes, said", [
    ({"mode": "sometimes"}, "use one of exact, auto"),
    ({"runs": 1}, "at least 2 runs"),
    ({"safety": 0.5}, "at least 1"),
    ({"overrides": ["c"]}, "expected an object"),
    ({"relocate": "yes"}, "relocate="),
])
def test_invalid_settings_are_refused_with_the_reason(changes, said):
    with pytest.raises(ConfigurationError, match=said):
        VerificationSettings(**changes)


def test_the_dict_form_round_trips_and_equal_settings_have_equal_keys():
    settings = VerificationSettings(mode="auto", runs=12, overrides={"c": "f32:ulp:4"}, derived={"*": "bitwise"},
                                    relocate=False, every_iteration=True)
    assert VerificationSettings.from_dict(settings.to_dict()) == settings
    same = VerificationSettings(every_iteration=True, relocate=False, derived={"*": "bitwise"},
                                overrides={"c": "f32:ulp:4"}, runs=12, mode="auto")
    assert same.key() == settings.key() and settings.key() != VerificationSettings().key()
    assert settings.with_(runs=4).runs == 4 and settings.runs == 12


def test_unknown_fields_are_named():
    with pytest.raises(ConfigurationError, match="unknown field.*tolerance"):
        VerificationSettings.from_dict({"tolerance": "auto"})
