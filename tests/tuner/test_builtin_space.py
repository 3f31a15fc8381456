"""The built-in space: covering launch shapes, launch safety, axes, presets, baseline."""

from __future__ import annotations

import pytest

from mneme.errors import ConfigurationError
from mneme.model.experiment import Dim3
from tuner.space.builtin import (
    BuiltinSearchSpace,
    BuiltinSpaceSettings,
    preset_settings,
)
from tuner.space.launch_shapes import (
    RecordedLaunch,
    axis_candidates,
    block_shapes,
    covering_grid,
    tuned_axes,
)
from tuner.strategies.sample_strategy import ExhaustiveSamplingStrategy
from tuner.testing import vecadd_kernel


def test_axis_candidates_hold_recorded_powers_scales_and_divisors():
    c = axis_candidates(recorded_block=256, total=10_240_000, axis=0, limit=1024)
    for v in (256, 1, 2, 32, 1024, 128, 192, 320, 384, 512, 1000, 625):
        assert v in c
    assert max(c) <= 1024
    assert axis_candidates(4, total=16, axis=2, limit=1024) == [1, 2, 3, 4, 5, 6, 8, 16]


@pytest.mark.parametrize("safety,limit", [("conservative", 256), ("balanced", 512), ("aggressive", 1024)])
def test_launch_safety_bounds_threads_per_block(safety, limit):
    recorded = RecordedLaunch(Dim3(40000), Dim3(256))
    shapes = block_shapes(recorded, "x", safety)
    assert shapes[0] == Dim3(256) and max(s.count for s in shapes) == limit


def test_every_shape_covers_the_recorded_work():
    recorded = RecordedLaunch(Dim3(30, 17, 1), Dim3(16, 8, 1))
    shapes = block_shapes(recorded, "xy", "aggressive")
    assert len(shapes) > 20
    for block in shapes:
        grid = covering_grid(recorded.total, block)
        for t, g, b in zip(recorded.total.as_tuple(), grid.as_tuple(), block.as_tuple()):
            assert g * b >= t and (g - 1) * b < t
        assert block.count <= 1024 and block.z <= 64


def test_launch_dim_picks_axes():
    recorded = RecordedLaunch(Dim3(30, 17, 1), Dim3(16, 8, 1))
    assert tuned_axes("auto", recorded) == (0, 1)
    assert tuned_axes("none", recorded) == ()
    assert tuned_axes("xyz", recorded) == (0, 1, 2)
    assert block_shapes(recorded, "none", "aggressive") == [Dim3(16, 8, 1)]
    assert {b.y for b in block_shapes(recorded, "x", "aggressive")} == {8}
    with pytest.raises(ConfigurationError, match="launch-dim"):
        tuned_axes("w", recorded)


def test_z_axis_is_capped_at_64():
    recorded = RecordedLaunch(Dim3(1, 1, 64), Dim3(1, 1, 32))
    assert max(b.z for b in block_shapes(recorded, "xyz", "aggressive")) == 64


def test_presets_set_the_reference_dimensions():
    quick = BuiltinSearchSpace(vecadd_kernel(), preset_settings("quick", {}))
    assert quick.dimensions()["passes"].values() == ["default<O3>", "default<O2>"]
    assert quick.dimensions()["codegen_opt"].values() == [2, 3]
    assert all(parse <= 256 for parse in (b.count for b in quick.shapes))
    launch = BuiltinSearchSpace(vecadd_kernel(), preset_settings("launch", {}))
    assert launch.dimensions()["passes"].values() == ["default<O3>"]
    assert launch.dimensions()["codegen_opt"].values() == [3]
    compiler = BuiltinSearchSpace(vecadd_kernel(), preset_settings("compiler", {}))
    assert compiler.dimensions()["block_shape"].values() == ["256x1x1"]
    assert compiler.dimensions()["passes"].size() == 5 and compiler.dimensions()["codegen_opt"].values() == [1, 2, 3]
    full = BuiltinSearchSpace(vecadd_kernel(), preset_settings("full", {}))
    dims = full.dimensions()
    for name in ("specialize", "specialize_dims", "set_launch_bounds"):
        assert dims[name].values() == [False, True]
    assert dims["min_blocks_per_sm"].values() == list(range(1, 9))
    assert max(b.count for b in full.shapes) == 1024


def test_command_line_overrides_the_preset():
    s = preset_settings("launch", {"launch_safety": "aggressive", "passes": ["default<O1>", "default<Oz>"],
                                   "launch_dim": None})
    assert s.launch_safety == "aggressive" and s.passes == ["default<O1>", "default<Oz>"] and s.launch_dim == "auto"
    with pytest.raises(ConfigurationError, match="space-preset"):
        preset_settings("huge", {})


def test_baseline_is_the_recorded_launch_at_the_highest_codegen_level():
    space = BuiltinSearchSpace(vecadd_kernel(shared_mem=128), preset_settings("quick", {}))
    base = space.baseline()
    assert base.grid == Dim3(40000) and base.block == Dim3(256) and base.shared_mem == 128
    assert base.codegen_opt == 3


def test_derived_configurations_are_valid_and_keep_shared_memory():
    space = BuiltinSearchSpace(vecadd_kernel(shared_mem=64), preset_settings("full", {}))
    configs = []
    strategy = ExhaustiveSamplingStrategy(space)
    for _ in range(3000):
        cand = strategy.ask()
        if cand is None:
            break
        configs.append(cand.configuration)
    assert configs and all(c.is_valid() for c in configs)
    assert all(c.shared_mem == 64 for c in configs)
    bounded = [c for c in configs if c.set_launch_bounds]
    assert bounded and all(c.max_threads == c.block.count for c in bounded)


def test_launch_bounds_policy_powers_of_two_filters_too_small_bounds():
    settings = BuiltinSpaceSettings(launch_dim="x", launch_safety="balanced", passes=["default<O3>"],
                                    codegen_opt=[3], launch_bounds="on", max_threads_policy="powers-of-two",
                                    max_threads_range=(64, 1024), min_blocks_per_sm=[1, 2])
    space = BuiltinSearchSpace(vecadd_kernel(), settings)
    configs = list(ExhaustiveSamplingStrategy(space))
    assert configs and all(c.set_launch_bounds and c.max_threads >= c.block.count for c in configs)
    assert {c.max_threads for c in configs} == {64, 128, 256, 512, 1024}


def test_kernel_with_plain_tuple_dims_is_accepted():
    class K:
        grid_dim = (8, 1, 1)
        block_dim = {"x": 32, "y": 1, "z": 1}
        shared_mem = 0

    space = BuiltinSearchSpace(K(), preset_settings("standard", {}))
    assert space.baseline().block == Dim3(32)
