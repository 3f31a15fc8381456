"""Tolerance policies at replay time: parsing overrides and judging the engine's statistics."""

from __future__ import annotations

import json
import math

import pytest

from mneme.errors import ConfigurationError
from mneme.format.policy import VerifyPolicy
from mneme.replay.tolerance import (
    BYTEWISE_CODE,
    DTYPE_CODES,
    NO_INDEX,
    ToleranceOverrides,
    engine_check,
    judge,
    norms,
    parse_policy_spec,
)


def stats(sum_abs=0.0, sum_sq=0.0, max_abs=0.0, ref_abs=0.0, ref_sq=0.0, ref_max=0.0, max_rel=0.0):
    return (sum_abs, sum_sq, max_abs, ref_abs, ref_sq, ref_max, max_rel)


def test_policy_specs():
    assert parse_policy_spec("bitwise") == VerifyPolicy()
    assert parse_policy_spec("f32:relative:1e-6") == VerifyPolicy("f32", "relative", 1e-6, "none")
    assert parse_policy_spec("F64:Absolute:0.5:L2") == VerifyPolicy("f64", "absolute", 0.5, "l2")
    for bad, what in (("f32:relative", "dtype:mode"), ("f33:relative:1", "dtype"), ("f32:close:1", "mode"),
                      ("f32:relative:x", "not a number"), ("f32:relative:-1", "threshold"),
                      ("f32:relative:1:l3", "norm")):  # fmt: skip
        with pytest.raises(ConfigurationError, match=what):
            parse_policy_spec(bad)


def test_overrides_from_flags_and_files(tmp_path):
    f = tmp_path / "tol.json"
    f.write_text(json.dumps({"c": {"dtype": "f32", "mode": "relative", "threshold": 1e-3}, "*": "f64:absolute:1"}))
    o = ToleranceOverrides.parse(["c=f32:absolute:2:linf", "0x7F0000000000=u8:absolute:1"], [f])
    assert o.policy_for("c", 1, None) == VerifyPolicy("f32", "absolute", 2.0, "linf")  # the flag wins
    assert o.policy_for("a", 0x7F0000000000, None) == VerifyPolicy("u8", "absolute", 1.0)  # by base
    assert o.policy_for("b", 5, VerifyPolicy("f32", "relative", 1.0)) == VerifyPolicy("f64", "absolute", 1.0)
    assert ToleranceOverrides.empty().policy_for("b", 5, None) == VerifyPolicy()  # bitwise by default
    recorded = VerifyPolicy("f32", "relative", 1.0)
    assert ToleranceOverrides.empty().policy_for("b", 5, recorded) == recorded
    assert o.unused_selectors([("c", 1), ("a", 0x7F0000000000)]) == []
    assert o.unused_selectors([("a", 1)]) == ["c", "0x7f0000000000"]
    assert ToleranceOverrides.from_mapping(o.to_dict()) == o


def test_override_errors_say_what_to_write(tmp_path):
    with pytest.raises(ConfigurationError, match="NAME_OR_BASE=dtype:mode"):
        ToleranceOverrides.parse(["f32:relative:1"])
    with pytest.raises(ConfigurationError, match="cannot read the tolerance file"):
        ToleranceOverrides.parse([], [tmp_path / "missing.json"])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigurationError, match="not valid JSON"):
        ToleranceOverrides.parse([], [bad])
    bad.write_text(json.dumps({"c": {"mode": "relative", "dtype": "f99"}}))
    with pytest.raises(ConfigurationError, match="f99"):
        ToleranceOverrides.parse([], [bad])
    with pytest.raises(ConfigurationError, match="hex base"):
        ToleranceOverrides.from_mapping({"0xZZ": "bitwise"})


def test_engine_checks():
    assert engine_check(1, 2, 10, VerifyPolicy()) == (1, 2, 10, BYTEWISE_CODE, 0, 0.0, 0)
    check = engine_check(1, 2, 16, VerifyPolicy("f32", "relative", 1e-6, "l2"))
    assert check == (1, 2, 16, DTYPE_CODES["f32"], 1, 1e-6, 0)
    assert engine_check(1, 2, 16, VerifyPolicy("f32", "ulp", 8)) == (1, 2, 16, DTYPE_CODES["f32"], 2, 8.0, 0)
    # multiset: a bytewise pass over the region plus the hashes of both sides, as 4-byte elements
    assert engine_check(1, 2, 16, VerifyPolicy("i32", "multiset")) == (1, 2, 16, BYTEWISE_CODE, 0, 0.0, 4)
    assert engine_check(1, 2, 16, VerifyPolicy("f32", "ulp", 8), hash_elem=4)[-1] == 4
    with pytest.raises(ConfigurationError, match="cannot be compared as f64"):
        engine_check(1, 2, 12, VerifyPolicy("f64", "absolute", 1.0))


def test_bitwise_verdicts():
    ok = judge(VerifyPolicy(), stats(), (0, NO_INDEX, 0), 64)
    assert ok.passed and ok.report["mismatched_bytes"] == 0
    bad = judge(VerifyPolicy(), stats(), (3, 40, 0), 64)
    assert not bad.passed and bad.report["first_mismatch_offset"] == 40


def test_elementwise_verdicts():
    policy = VerifyPolicy("f32", "absolute", 0.1)
    assert judge(policy, stats(max_abs=0.05), (0, NO_INDEX, 0), 400).passed
    bad = judge(policy, stats(max_abs=0.5), (2, 7, 0), 400)
    assert not bad.passed
    assert bad.report["mismatched_elements"] == 2 and bad.report["first_mismatch_offset"] == 28
    nan = judge(policy, stats(), (1, 3, 1), 400)
    assert not nan.passed and nan.report["nan_mismatches"] == 1


@pytest.mark.parametrize(
    "norm,s,diff,ref",
    [
        ("l1", stats(sum_abs=2.0, ref_abs=100.0), 2.0, 100.0),
        ("l2", stats(sum_sq=4.0, ref_sq=10000.0), 2.0, 100.0),
        ("linf", stats(max_abs=2.0, ref_max=100.0), 2.0, 100.0),
    ],
)
def test_norm_verdicts(norm, s, diff, ref):
    assert norms(norm, s) == (pytest.approx(diff), pytest.approx(ref))
    # Absolute: the norm of the difference against the threshold.
    assert judge(VerifyPolicy("f64", "absolute", 2.0, norm), s, (5, 0, 0), 80).passed
    assert not judge(VerifyPolicy("f64", "absolute", 1.9, norm), s, (5, 0, 0), 80).passed
    # Relative: against threshold x the norm of the recorded values.
    assert judge(VerifyPolicy("f64", "relative", 0.02, norm), s, (5, 0, 0), 80).passed
    failed = judge(VerifyPolicy("f64", "relative", 0.019, norm), s, (5, 0, 0), 80)
    assert not failed.passed and failed.report["limit"] == pytest.approx(1.9)
    # A NaN where the recording has a number fails whatever the norm says.
    assert not judge(VerifyPolicy("f64", "absolute", 10.0, norm), s, (1, 0, 1), 80).passed
    assert not judge(VerifyPolicy("f64", "absolute", 10.0, norm), stats(sum_abs=math.inf, sum_sq=math.inf,
                     max_abs=math.inf), (0, 0, 0), 80).passed  # fmt: skip
