"""Nondeterminism detection and ``--tolerance auto`` bounds, on synthetic device statistics (no GPU)."""

from __future__ import annotations

import json
import struct

import pytest

from mneme.errors import ArtifactError, ConfigurationError
from mneme.format.policy import VerifyPolicy
from mneme.model.experiment import ExperimentResult
from mneme.model.verification import VerificationSettings
from mneme.replay.nondeterminism import (
    DETERMINISTIC_MISMATCH,
    EXACT,
    NONDETERMINISTIC,
    DerivedTolerance,
    RunStats,
    classify,
    derive_policy,
    dtype_from_content,
    dtype_from_params,
    load_derived,
    param_types,
    pointee_dtype,
    save_derived,
    sidecar_name,
)
from mneme.replay.tolerance import (
    SOURCE_AUTO,
    SOURCE_DEFAULT,
    SOURCE_FLAG,
    SOURCE_RECORDED,
    ToleranceOverrides,
    deviation,
    is_exact,
    judge,
    tolerance_flags,
    verification_from_flags,
    worse,
)
from mneme.store import open_store

EXPECTED = ((11, 22), 33)


def run(differing=0, ulp=0, abs_=0.0, rel=0.0, multiset=(11, 22), positional=33, nan=0):
    return RunStats(differing, ulp, abs_, rel, nan, multiset, positional, *EXPECTED)


def engine_counters(violations=0, differing=0, max_ulp=0, actual=(1, 2, 3), expected=(1, 2, 3)):
    """The 11 counters a typed check with hashes returns (compare_kernels.cu)."""
    return (violations, 2**64 - 1, 0, differing, max_ulp, *actual, *expected)


def stats(max_abs=0.0, max_rel=0.0):
    return (0.0, 0.0, max_abs, 0.0, 0.0, 0.0, max_rel)


def find(runs, dtype="f32", size=4):
    return classify("acc", "heap", 0x7F0000000000, size, dtype, "parameter type", runs)


# -- classification -----------------------------------------------------------------------------


def test_all_runs_exact():
    f = find([run() for _ in range(8)])
    assert f.classification == EXACT and f.runs == 8 and f.runs_differing == 0 and not f.permuted
    assert derive_policy(f) is None


def test_runs_that_agree_with_each_other_but_not_the_recording_are_a_real_mismatch():
    f = find([run(differing=1, ulp=3, abs_=1e-6, multiset=(5, 5), positional=99) for _ in range(8)])
    assert f.classification == DETERMINISTIC_MISMATCH and f.distinct_outputs == 1
    assert derive_policy(f) is None  # stays bitwise: it must fail
    assert "real mismatch" in f.describe()


def test_runs_that_differ_from_each_other_are_nondeterministic():
    runs = [run()] + [run(differing=1, ulp=u, abs_=u * 1e-7, rel=u * 1e-7, multiset=(u, u), positional=100 + u)
            for u in (1, 3, 2)]
    f = find(runs)
    assert f.classification == NONDETERMINISTIC
    assert (f.runs, f.runs_differing, f.distinct_outputs, f.max_ulp) == (4, 3, 4, 3)
    assert f.max_abs_diff == pytest.approx(3e-7) and not f.permuted
    policy = derive_policy(f, safety=4)
    assert policy == VerifyPolicy("f32", "ulp", 12.0)
    assert "nondeterministic" in f.describe()


def test_bound_has_a_floor_of_safety_ulps():
    f = find([run(differing=1, ulp=1, multiset=(1, 1), positional=5), run(differing=1, ulp=1, multiset=(2, 2), positional=6)])
    assert derive_policy(f, safety=4).threshold == 4.0
    assert derive_policy(f, safety=2.5).threshold == 3.0  # rounded up


def test_permuted_region_gets_a_multiset_policy():
    runs = [run(differing=40, ulp=10**9, positional=200 + i) for i in range(8)]  # same multiset, other order
    f = find(runs, dtype="i32", size=1024)
    assert f.classification == NONDETERMINISTIC and f.permuted and f.elements == 256
    assert derive_policy(f) == VerifyPolicy("i32", "multiset")


def test_changed_values_are_not_a_permutation():
    runs = [run(differing=2, ulp=5, multiset=(7, 8), positional=300 + i) for i in range(3)]
    assert not find(runs).permuted


def test_classify_needs_runs():
    with pytest.raises(ValueError):
        find([])


# -- verdicts of the new modes ------------------------------------------------------------------


def test_ulp_verdict_uses_the_engine_violations():
    policy = VerifyPolicy("f32", "ulp", 8)
    ok = judge(policy, stats(1e-7), engine_counters(differing=1, max_ulp=3), 4)
    assert ok.passed and ok.report["max_ulp"] == 3 and ok.report["differing_elements"] == 1
    bad = judge(policy, stats(1.0), engine_counters(violations=1, differing=1, max_ulp=10**6), 4)
    assert not bad.passed and bad.report["mismatched_elements"] == 1


def test_multiset_verdict_compares_the_hashes():
    policy = VerifyPolicy("i32", "multiset")
    same = judge(policy, stats(), (12, 0, 0, 0, 0, 5, 6, 70, 5, 6, 71), 64)
    assert same.passed and same.report["same_multiset"] and same.report["mismatched_bytes"] == 12
    other = judge(policy, stats(), (12, 0, 0, 0, 0, 5, 9, 70, 5, 6, 71), 64)
    assert not other.passed


def test_new_modes_are_elementwise_only():
    with pytest.raises(ArtifactError, match="norm must be none"):
        VerifyPolicy("f32", "ulp", 4, "l2")
    assert VerifyPolicy("f32", "ulp", 16).spec() == "f32:ulp:16"
    assert VerifyPolicy().spec() == "bitwise"


def test_deviation_and_worst():
    policy = VerifyPolicy("f32", "ulp", 8)
    first = deviation(policy, stats(1e-7, 2e-7), engine_counters(differing=1, max_ulp=2))
    second = deviation(policy, stats(3e-7, 1e-7), engine_counters(differing=0, max_ulp=0))
    both = worse(worse(None, first), second)
    assert both == {"differing_elements": 1, "max_ulp": 2, "max_abs_diff": 3e-7, "max_rel_diff": 2e-7}
    assert not is_exact(both) and is_exact(second)


# -- precedence and settings --------------------------------------------------------------------


def test_flags_win_then_annotations_then_auto():
    recorded, derived = VerifyPolicy("f32", "relative", 1e-3), VerifyPolicy("f32", "ulp", 16)
    flags = ToleranceOverrides.parse(["acc=f64:absolute:1"])
    assert flags.resolve("acc", 0, recorded, derived)[1] == SOURCE_FLAG
    none = ToleranceOverrides.empty()
    assert none.resolve("acc", 0, recorded, derived) == (recorded, SOURCE_RECORDED)
    assert none.resolve("acc", 0, None, derived) == (derived, SOURCE_AUTO)
    assert none.resolve("acc", 0, None, None) == (VerifyPolicy(), SOURCE_DEFAULT)


def test_tolerance_flags_split_the_mode_from_the_policies(tmp_path):
    policy_file = tmp_path / "policies.json"
    policy_file.write_text(json.dumps({"acc": {"dtype": "f32", "mode": "ulp", "threshold": 4}, "out": "bitwise"}))
    mode, policies = tolerance_flags(["exact", "acc=f32:ulp:16", " auto "], [policy_file])
    assert mode == "auto"  # the last mode given
    assert policies == {"acc": "f32:ulp:16", "out": "bitwise"}  # flags win over the file
    assert tolerance_flags([]) == (None, {})
    with pytest.raises(ConfigurationError, match="exact, auto or NAME_OR_BASE=dtype:mode"):
        tolerance_flags(["sometimes"])
    with pytest.raises(ConfigurationError, match="f99"):
        tolerance_flags(["acc=f99:ulp:1"])


def test_the_shared_flags_become_one_settings_object(tmp_path):
    """``mneme replay`` and ``mneme tune`` turn their shared flags into settings through one function."""
    policy_file = tmp_path / "policies.json"
    policy_file.write_text(json.dumps({"acc": "f32:ulp:4", "out": "bitwise"}))
    settings = verification_from_flags(["acc=f32:ulp:16", "auto"], [policy_file], 12, True, every_iteration=True)
    assert settings == VerificationSettings(mode="auto", runs=12, overrides={"acc": "f32:ulp:16", "out": "bitwise"},
                                            relocate=False, every_iteration=True)
    assert verification_from_flags() == VerificationSettings()  # mneme replay's defaults
    tuned = verification_from_flags([], default_mode="auto", policies={"acc": "f32:ulp:2", "x": "bitwise"})
    assert tuned.mode == "auto" and tuned.overrides == {"acc": "f32:ulp:2", "x": "bitwise"} and tuned.relocate is None
    assert verification_from_flags(["acc=f32:ulp:8"], policies={"acc": "f32:ulp:2"}).overrides == {"acc": "f32:ulp:8"}
    with pytest.raises(ConfigurationError, match="at least 2 runs"):
        verification_from_flags(tolerance_runs=1)


def test_explicit_policies_win_over_the_policies_beneath_them():
    derived = ToleranceOverrides.parse(["acc=f32:ulp:12", "out=f32:ulp:48"])  # what a tuner derived
    explicit = ToleranceOverrides.parse(["0x7f0000000000=f64:absolute:1"])
    both = explicit.over(derived)
    # The explicit base selector wins although the derived policy names the region (a name would win alone).
    assert both.resolve("acc", 0x7F0000000000, None) == (VerifyPolicy("f64", "absolute", 1.0), SOURCE_FLAG)
    assert both.resolve("out", 5, None) == (VerifyPolicy("f32", "ulp", 48), SOURCE_FLAG)
    recorded = VerifyPolicy("f32", "relative", 1e-3)
    assert both.resolve("other", 6, recorded) == (recorded, SOURCE_RECORDED)
    assert ToleranceOverrides.parse(["*=bitwise"]).over(derived).resolve("out", 5, None)[0] == VerifyPolicy()
    assert both.unused_selectors([("acc", 0x7F0000000000), ("b", 1)]) == ["out"]
    assert ToleranceOverrides.empty().over(derived).resolve("out", 5, None)[0] == VerifyPolicy("f32", "ulp", 48)


# -- dtype guesses ------------------------------------------------------------------------------


def test_param_types_of_a_demangled_signature():
    sig = "reduce(float const*, float*, std::pair<int, int>, unsigned int)"
    assert param_types(sig) == ["float const*", "float*", "std::pair<int, int>", "unsigned int"]
    assert pointee_dtype("float const*") == "f32"
    assert pointee_dtype("double* __restrict__") is None or pointee_dtype("double*") == "f64"
    assert pointee_dtype("unsigned int*") == "u32" and pointee_dtype("int") is None


def test_dtype_from_the_pointer_parameter_into_the_region():
    base = 0x7F0000200000
    args = struct.pack("<QQi", 0x7F0000100000, base + 0, 5)
    params = [(0, 8), (8, 8), (16, 4)]
    sig = "k(int const*, double*, int)"
    assert dtype_from_params(base, 64, sig, params, args) == "f64"
    assert dtype_from_params(0x7F0000100000, 64, sig, params, args) == "i32"
    assert dtype_from_params(0x1000, 64, sig, params, args) is None
    assert dtype_from_params(base, 64, "k", params, args) is None  # extern "C": no types


def test_dtype_from_content():
    floats = struct.pack("<64f", *[0.5 + i for i in range(64)])
    assert dtype_from_content(floats, len(floats)) == "f32"
    doubles = struct.pack("<32d", *[1.0 / (i + 3) for i in range(32)])
    assert dtype_from_content(doubles, len(doubles)) == "f64"
    ints = struct.pack("<64i", *range(100000, 100064))
    assert dtype_from_content(ints, len(ints)) == "i32"
    assert dtype_from_content(b"\x01\x02\x03", 3) == "u8"


# -- the stored derivation ----------------------------------------------------------------------


def test_sidecar_round_trip(tmp_path):
    store = open_store(str(tmp_path))
    f = find([run(differing=1, ulp=u, multiset=(u, u), positional=u) for u in (1, 2)])
    derived = DerivedTolerance.derive([f], runs=2, safety=4.0, device="test")
    assert derived.policies == {"acc": VerifyPolicy("f32", "ulp", 8)}
    assert "acc=f32:ulp:8" in derived.describe()
    assert sidecar_name("123.json") == "123.tolerance.json"
    assert load_derived(store, "123.json", "9") is None
    save_derived(store, "123.json", "9", derived)
    save_derived(store, "123.json", "10", DerivedTolerance.derive([], runs=2, safety=4.0))
    back = load_derived(store, "123.json", "9")
    assert back.policies == derived.policies and back.findings == derived.findings
    assert back.provenance()["runs"] == 2 and back.provenance()["derived"]
    (tmp_path / "123.tolerance.json").write_text("{")
    with pytest.raises(ArtifactError, match="delete it"):
        load_derived(store, "123.json", "9")


def test_result_exactness_and_round_trip():
    within = {"acc": {"policy": "f32:ulp:8", "source": "auto", "exact": False, "worst": {"max_ulp": 2}}}
    result = ExperimentResult(verified=True, verified_within=within, nondeterminism=[{"region": "acc"}])
    assert not result.exact
    assert ExperimentResult(verified=True).exact
    back = ExperimentResult.from_dict(result.to_dict())
    assert back.verified_within == within and back.nondeterminism == [{"region": "acc"}]


def test_verified_within_and_nondeterminism_cross_the_wire_with_their_counts():
    from replay_server.protocol.convert import result_from_proto, result_to_proto

    within = {"0x7f0000400000": {"policy": "f32:ulp:12", "source": "auto", "exact": False,
                                 "worst": {"max_ulp": 3, "max_abs_diff": 0.25, "max_rel_diff": "inf"},
                                 "derived": {"derived": True, "runs": 8, "safety_factor": 4.0}}}
    result = ExperimentResult(verified=True, status="verified", verified_within=within,
                              nondeterminism=[{"region": "acc", "runs": 8, "permuted": False}])
    back = result_from_proto(result_to_proto(result))
    assert back.verified_within == within and back.nondeterminism == result.nondeterminism
    assert isinstance(back.verified_within["0x7f0000400000"]["derived"]["runs"], int)


def test_failure_text_names_the_ulp_distance_and_the_bound():
    from mneme.replay.judge import mismatch_summary as _mismatch_summary

    policy = VerifyPolicy("f32", "ulp", 24)
    report = judge(policy, stats(2.29e4), engine_counters(violations=1, differing=1, max_ulp=716), 4).report
    text = _mismatch_summary([{"region": "acc", "kind": "heap", "failed_launches": [0, 3], **report}])
    assert "1 of 1 elements outside tolerance" in text and "716 ULP > 24 ULP" in text
    report = judge(VerifyPolicy("i32", "multiset"), stats(), (8, 0, 0, 0, 0, 1, 2, 3, 1, 9, 3), 64).report
    text = _mismatch_summary([{"region": "out", "kind": "heap", "failed_launches": [0], **report}])
    assert "not the recorded multiset of 16 i32 elements" in text
