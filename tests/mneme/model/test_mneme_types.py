"""The experiment model: round trips with the reference's dicts, validation, hash stability."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mneme.errors import ConfigurationError
from mneme.model.experiment import (
    STATUSES,
    Dim3,
    ExperimentConfiguration,
    ExperimentResult,
)

# The baseline configuration exactly as the reference prints it.
REFERENCE_BASELINE = {
    "grid": {"x": 40000, "y": 1, "z": 1},
    "block": {"x": 256, "y": 1, "z": 1},
    "shared_mem": 0,
    "specialize": False,
    "set_launch_bounds": False,
    "max_threads": 1024,
    "min_blocks_per_sm": 1,
    "specialize_dims": False,
    "passes": "default<O3>",
    "codegen_opt": 3,
    "codegen_method": "serial",
    "prune": True,
    "internalize": True,
}

# A reference replay result (the slides' "Result" dict).
REFERENCE_RESULT = {
    "preprocess_ir_time": 9.2298723757267e-06,
    "opt_time": 0.003,
    "codegen_time": 0.01226967596448958,
    "obj_size": 4792,
    "exec_time": [84048, 82561, 81761, 83360, 76520],
    "verified": True,
    "executed": True,
    "failed": False,
    "start_time": "",
    "end_time": "",
    "gpu_id": 0,
    "const_mem_usage": -1,
    "local_mem_usage": 0,
    "reg_usage": 12,
    "error": "",
}


def test_reference_baseline_round_trips_exactly():
    config = ExperimentConfiguration.from_dict(REFERENCE_BASELINE)
    assert config.to_dict() == REFERENCE_BASELINE
    assert list(config.to_dict()) == list(REFERENCE_BASELINE)  # same key order as printed
    assert json.dumps(config.to_dict(), indent=2) == json.dumps(REFERENCE_BASELINE, indent=2)


def test_partial_dict_takes_reference_defaults():
    # The reference example's derived() passes only these keys.
    config = ExperimentConfiguration.from_dict(
        {"block": {"x": 128, "y": 1, "z": 1}, "grid": {"x": 80000, "y": 1, "z": 1},
         "shared_mem": 0, "passes": "default<Oz>"}
    )
    expected = dict(REFERENCE_BASELINE, block={"x": 128, "y": 1, "z": 1},
                    grid={"x": 80000, "y": 1, "z": 1}, passes="default<Oz>")
    assert config.to_dict() == expected
    assert config.block.x == 128 and config.passes == "default<Oz>"


def test_missing_axes_default_to_one():
    config = ExperimentConfiguration.from_dict({"block": {"x": 64}})
    assert config.block == Dim3(64, 1, 1)


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ({"blok": {"x": 1}}, "unknown configuration keys"),
        ({"block": {"x": 1, "w": 2}}, "unknown axes"),
        ({"shared_mem": "lots"}, "shared_mem must be an integer"),
        ({"specialize": "maybe"}, "specialize must be true or false"),
        ({"passes": 3}, "passes must be a string"),
        ({"block": {"x": True}}, "must be an integer"),
    ],
)
def test_from_dict_rejects_bad_input_clearly(bad, fragment):
    with pytest.raises(ConfigurationError, match=fragment):
        ExperimentConfiguration.from_dict(bad)


@pytest.mark.parametrize(
    "changes, fragment",
    [
        ({"block": {"x": 1025}}, "block.x=1025 exceeds"),
        ({"block": {"x": 512, "y": 4}}, "2048 threads per block exceed"),
        ({"block": {"x": 1, "y": 1, "z": 65}}, "block.z=65 exceeds"),
        ({"grid": {"x": 1, "y": 65536, "z": 1}}, "grid.y=65536 exceeds"),
        ({"grid": {"x": 1, "y": 1, "z": 65536}}, "grid.z=65536 exceeds"),
        ({"grid": {"x": 0}}, "grid.x=0 must be at least 1"),
        ({"shared_mem": -1}, "shared_mem=-1"),
        ({"codegen_opt": 7}, "codegen_opt=7"),
        ({"codegen_method": "magic"}, "codegen_method"),
        ({"set_launch_bounds": True, "max_threads": 128}, "max_threads=128 is below the 256"),
        ({"set_launch_bounds": True, "max_threads": None}, "needs max_threads"),
    ],
)
def test_invalid_configurations_say_why(changes, fragment):
    config = ExperimentConfiguration.from_dict(dict(REFERENCE_BASELINE, **changes))
    assert not config.is_valid()
    assert any(fragment in e for e in config.validation_errors()), config.validation_errors()


def test_launch_bounds_rule_only_applies_when_set():
    config = ExperimentConfiguration.from_dict(dict(REFERENCE_BASELINE, max_threads=64))
    assert config.is_valid()  # max_threads is ignored without set_launch_bounds
    assert config.replace(set_launch_bounds=True).is_valid() is False
    assert config.replace(set_launch_bounds=True, max_threads=256).is_valid()


def test_reference_baseline_is_valid_and_grid_x_can_be_large():
    assert ExperimentConfiguration.from_dict(REFERENCE_BASELINE).is_valid()
    big = ExperimentConfiguration.from_dict({"grid": {"x": 2**31 - 1}, "block": {"x": 1024}})
    assert big.is_valid()


def test_ground_makes_equivalent_configurations_hash_alike():
    a = ExperimentConfiguration.from_dict({"block": {"x": 256}, "max_threads": 512})
    b = ExperimentConfiguration.from_dict({"block": {"x": 256}, "max_threads": 1024})
    assert a.hash() != b.hash()
    assert a.ground().hash() == b.ground().hash()
    c = ExperimentConfiguration.from_dict({"set_launch_bounds": True, "max_threads": None,
                                           "min_blocks_per_sm": None})
    assert c.ground().max_threads == 1024 and c.ground().min_blocks_per_sm == 1


def test_hash_is_a_golden_value():
    # Changing this value breaks resume of every existing tuning run: do it only with a format bump.
    assert ExperimentConfiguration.from_dict(REFERENCE_BASELINE).hash() == GOLDEN_BASELINE_HASH


GOLDEN_BASELINE_HASH = "243f297d9c6eff95"


def test_hash_is_stable_across_processes():
    code = (
        "from mneme.model.experiment import ExperimentConfiguration as C;"
        "print(C.from_dict({'block': {'x': 128}, 'passes': 'default<Os>'}).hash())"
    )
    outputs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"PYTHONHASHSEED": seed, **_env()}, check=True).stdout.strip()
        for seed in ("0", "1", "12345")
    }
    assert len(outputs) == 1


def _env():
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}


dims = st.builds(Dim3, st.integers(1, 2048), st.integers(1, 2048), st.integers(1, 128))


@given(
    grid=dims, block=dims, shared=st.integers(0, 1 << 20), flags=st.lists(st.booleans(), min_size=5, max_size=5),
    max_threads=st.one_of(st.none(), st.integers(1, 2048)), opt=st.integers(0, 4),
    passes=st.sampled_from(["default<O1>", "default<O2>", "default<O3>", "default<Os>", "default<Oz>"]),
)
def test_round_trip_property(grid, block, shared, flags, max_threads, opt, passes):
    config = ExperimentConfiguration(
        grid=grid, block=block, shared_mem=shared, specialize=flags[0], set_launch_bounds=flags[1],
        max_threads=max_threads, specialize_dims=flags[2], passes=passes, codegen_opt=opt,
        prune=flags[3], internalize=flags[4],
    )
    again = ExperimentConfiguration.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
    assert again.hash() == config.hash()


def test_result_round_trips_the_reference_result():
    result = ExperimentResult.from_dict(REFERENCE_RESULT)
    out = result.to_dict()
    assert {k: out[k] for k in REFERENCE_RESULT} == REFERENCE_RESULT
    assert ExperimentResult.from_dict(out) == result


def test_result_to_dict_is_a_copy_in_field_order_whatever_the_instance_holds():
    import dataclasses

    result = ExperimentResult(exec_time=[3, 4], mismatches=[{"region": "a"}], verified_within={"a": {"exact": True}})
    names = [f.name for f in dataclasses.fields(ExperimentResult)]
    out = result.to_dict()
    assert list(out) == names and out == {n: getattr(result, n) for n in names}
    out["exec_time"].append(5)
    out["mismatches"][0]["region"] = "b"
    out["verified_within"]["a"]["exact"] = False
    assert result.exec_time == [3, 4] and result.mismatches == [{"region": "a"}]
    assert result.verified_within == {"a": {"exact": True}}
    result.note = "not a field"  # an attribute beyond the fields: still only the fields, in their order
    assert list(result.to_dict()) == names


def test_result_measured_times_skip_warmups():
    result = ExperimentResult(exec_time=[9, 8, 1, 2, 3], warmup=2)
    assert result.measured_times == [1, 2, 3]


def test_failure_result_carries_status_and_reason():
    result = ExperimentResult.failure("compile_error", "ptxas: syntax error")
    assert result.failed and not result.verified and result.status in STATUSES
    assert ExperimentResult.from_dict(result.to_dict()) == result


def test_result_rejects_unknown_keys():
    with pytest.raises(ConfigurationError, match="unknown result keys"):
        ExperimentResult.from_dict({"exec_time": [], "bogus": 1})
