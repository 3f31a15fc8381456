"""Parameter types and SearchSpace helpers."""

from __future__ import annotations

import pytest

from mneme.errors import ConfigurationError
from mneme.model.experiment import ExperimentConfiguration
from tuner.space.search_space import (
    BoolParam,
    CategoricalParam,
    FixedParam,
    IntRangeParam,
    PipelineParam,
    RealParam,
    SearchSpace,
    code_variants,
    describe_space,
    dimensions_of,
    iterate_points,
    space_size,
)


def test_int_range_includes_both_ends_and_steps():
    p = IntRangeParam("block_dim_x", low=64, high=1024, step=64)
    assert p.values()[:3] == [64, 128, 192] and p.values()[-1] == 1024 and p.size() == 16
    assert p.contains(128) and not p.contains(100) and not p.contains(True)
    assert p.distribution().high == 1024


def test_int_range_rejects_bad_bounds():
    with pytest.raises(ConfigurationError, match="below low"):
        IntRangeParam("x", 10, 1)
    with pytest.raises(ConfigurationError, match="step"):
        IntRangeParam("x", 1, 10, step=0)


def test_categorical_bool_pipeline_fixed():
    assert CategoricalParam("c", ["a", "b"]).values() == ["a", "b"]
    assert BoolParam("flag").values() == [False, True]
    assert PipelineParam("passes").size() == 5
    assert FixedParam("k", 3).values() == [3]
    with pytest.raises(ConfigurationError, match="at least one"):
        CategoricalParam("c", [])
    with pytest.raises(ConfigurationError, match="repeat"):
        CategoricalParam("c", ["a", "a"])
    with pytest.raises(ConfigurationError, match="non-empty"):
        PipelineParam("passes", ["default<O3>", " "])


def test_real_param_enumerates_only_with_step():
    stepped = RealParam("f", 0.0, 1.0, step=0.25)
    assert stepped.values() == [0.0, 0.25, 0.5, 0.75, 1.0]
    continuous = RealParam("f", 0.0, 1.0)
    assert continuous.size() is None
    with pytest.raises(ConfigurationError, match="random or tpe"):
        continuous.values()


class TwoDims(SearchSpace):
    def dimensions(self):
        return {"block_dim_x": IntRangeParam("block_dim_x", 64, 192, 64), "passes": PipelineParam("passes")}

    def derived(self, params):
        return ExperimentConfiguration.from_dict({"block": {"x": params["block_dim_x"]}, "passes": params["passes"]})

    def baseline(self):
        return ExperimentConfiguration()


def test_iteration_order_last_dimension_fastest():
    points = list(iterate_points(TwoDims()))
    assert len(points) == space_size(TwoDims()) == 15
    assert [p["passes"] for p in points[:5]] == list(PipelineParam("passes").values())
    assert {p["block_dim_x"] for p in points[:5]} == {64}


class NoO1AtLargeBlocks(TwoDims):
    def constraints(self, params):
        return params["passes"] != "default<O1>"

    def derived(self, params):
        if params["passes"] == "default<Oz>":  # specialized launch extents: each block size is its own code
            return super().derived(params).replace(specialize_dims=True)
        return super().derived(params)


def test_code_variants_one_per_code_in_grid_order_or_none_when_too_many():
    variants = code_variants(TwoDims())
    assert [c.passes for c in variants] == list(PipelineParam("passes").values())
    assert all(c.block.x == 64 for c in variants)
    variants = code_variants(NoO1AtLargeBlocks())
    assert [(c.passes, c.block.x) for c in variants if c.passes == "default<Oz>"] == \
        [("default<Oz>", 64), ("default<Oz>", 128), ("default<Oz>", 192)]
    assert "default<O1>" not in {c.passes for c in variants} and len(variants) == 6
    assert code_variants(NoO1AtLargeBlocks(), max_variants=5) == []
    assert code_variants(TwoDims(), max_points=14) == []


def test_describe_space_is_json_ready():
    doc = describe_space(TwoDims())
    assert doc["size"] == 15 and doc["dimensions"]["passes"]["type"] == "pipeline"
    assert doc["baseline"]["passes"] == "default<O3>"


def test_dimensions_are_checked():
    class Bad(TwoDims):
        def dimensions(self):
            return {"a": IntRangeParam("b", 1, 2)}

    with pytest.raises(ConfigurationError, match="differs"):
        dimensions_of(Bad())

    class NotAParam(TwoDims):
        def dimensions(self):
            return {"a": [1, 2]}

    with pytest.raises(ConfigurationError, match="not a parameter type"):
        dimensions_of(NotAParam())

    class AsList(TwoDims):
        def dimensions(self):
            return [IntRangeParam("a", 1, 2), BoolParam("b")]

    assert list(dimensions_of(AsList())) == ["a", "b"]


def test_a_crashing_space_is_named():
    from tuner.strategies.sample_strategy import ExhaustiveSamplingStrategy

    class Crashing(TwoDims):
        def derived(self, params):
            return {"block": params["missing"]}

    with pytest.raises(ConfigurationError, match="Crashing.derived.*KeyError"):
        list(ExhaustiveSamplingStrategy(Crashing()))

    class NotAConfig(TwoDims):
        def derived(self, params):
            return {"block": {"x": 1}}

    with pytest.raises(ConfigurationError, match="ExperimentConfiguration.from_dict"):
        list(ExhaustiveSamplingStrategy(NotAConfig()))

    class BadConstraint(TwoDims):
        def constraints(self, params):
            return 1 / 0

    with pytest.raises(ConfigurationError, match="BadConstraint.constraints.*ZeroDivisionError"):
        list(ExhaustiveSamplingStrategy(BadConstraint()))


def test_a_bad_baseline_is_named():
    from tuner.space.search_space import baseline_checked

    class Oversized(TwoDims):
        def baseline(self):
            return ExperimentConfiguration.from_dict({"block": {"x": 2048}})

    with pytest.raises(ConfigurationError, match="Oversized.baseline.*exceeds"):
        baseline_checked(Oversized())
