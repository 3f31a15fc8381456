"""The per-result JSON texts are byte for byte what json.dumps writes (and the hash what it always was)."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mneme.model.experiment import Dim3, ExperimentConfiguration, configuration_hash
from mneme.model.json_text import (
    canonical_configuration_json,
    configuration_json,
    json_encoder,
)

dims = st.builds(Dim3, st.integers(0, 2**31), st.integers(0, 70000), st.integers(0, 70000))
configs = st.builds(
    ExperimentConfiguration,
    grid=dims, block=dims, shared_mem=st.integers(-5, 2**40), specialize=st.booleans(),
    set_launch_bounds=st.booleans(), max_threads=st.none() | st.integers(-1, 4096),
    min_blocks_per_sm=st.none() | st.integers(-1, 64), specialize_dims=st.booleans(),
    passes=st.text(), codegen_opt=st.integers(-3, 9), codegen_method=st.text(), prune=st.booleans(),
    internalize=st.booleans(),
)


@given(configs)
def test_configuration_texts_are_json_dumps(config):
    assert configuration_json(config) == json.dumps(config.to_dict()) == config.to_json()
    assert canonical_configuration_json(config) == json.dumps(config.to_dict(), sort_keys=True,
                                                              separators=(",", ":"))
    assert config.hash() == configuration_hash(config.to_dict())


@pytest.mark.parametrize("odd", [{"shared_mem": True}, {"codegen_opt": 3.0}, {"grid": Dim3(2.0, 1, 1)},
                                 {"max_threads": False}, {"prune": 1}])
def test_a_field_of_an_unexpected_type_leaves_the_text_to_json(odd):
    config = ExperimentConfiguration(**odd)  # (from_dict would have made these plain)
    assert configuration_json(config) is None and canonical_configuration_json(config) is None
    assert config.to_json() == json.dumps(config.to_dict())
    assert config.hash() == configuration_hash(config.to_dict())


def test_code_identity_is_equal_exactly_when_code_key_is():
    variants = [ExperimentConfiguration.from_dict(d) for d in (
        {}, {"block": {"x": 128}}, {"grid": {"x": 7}}, {"shared_mem": 64}, {"specialize": True},
        {"specialize_dims": True}, {"specialize_dims": True, "block": {"x": 128}},
        {"set_launch_bounds": True}, {"set_launch_bounds": True, "max_threads": 256},
        {"max_threads": 256}, {"min_blocks_per_sm": 4}, {"passes": "default<O1>"}, {"codegen_opt": 1},
        {"codegen_method": "parallel"}, {"prune": False}, {"internalize": False},
    )]
    for a, b in itertools.combinations_with_replacement(variants, 2):
        assert (a.code_identity() == b.code_identity()) == (a.code_key() == b.code_key()), (a, b)


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


@given(values)
def test_json_encoder_writes_what_json_dumps_writes(value):
    assert json_encoder()(value) == json.dumps(value)
    assert json_encoder(allow_nan=False, default=str)(value) == json.dumps(value, allow_nan=False, default=str)


def test_json_encoder_keeps_jsons_rules_for_special_values():
    strict, lenient = json_encoder(allow_nan=False), json_encoder()
    with pytest.raises(ValueError):
        strict({"time": math.inf})
    assert lenient({"time": math.inf, "x": math.nan}) == json.dumps({"time": math.inf, "x": math.nan})
    with pytest.raises(TypeError):
        strict({"when": object()})
    assert json_encoder(default=str)({"path": Dim3()}) == json.dumps({"path": Dim3()}, default=str)
