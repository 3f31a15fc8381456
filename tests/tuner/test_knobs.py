"""Which built-in knobs apply to a recorded kernel: SASS-only kernels keep their launch shape only."""

from types import SimpleNamespace

import pytest

from mneme.errors import ConfigurationError
from tuner.builtin_space import BuiltinSearchSpace
from tuner.knobs import knob_applicability
from tuner.options import TuneOptions
from tuner.space_factory import build_space


def _kernel(ptx: bool, bitcode: bool = False):
    code = SimpleNamespace(ptx="ref" if ptx else None, cubin="ref", bitcode="ref" if bitcode else None)
    return SimpleNamespace(kernel_name="sm90_xmma_gemm", code=code, grid_dim=(8, 1, 1), block_dim=(128, 1, 1),
                           shared_mem=0)


def test_a_kernel_with_ptx_tunes_every_ptx_tier_knob():
    knobs = knob_applicability(_kernel(ptx=True))
    assert set(knobs.applies) == {"block_shape", "codegen_opt", "specialize", "specialize_dims", "set_launch_bounds"}
    assert set(knobs.refused) == {"passes"}


def test_a_sass_only_kernel_keeps_its_launch_shape_and_names_what_it_refuses():
    kernel = _kernel(ptx=False)
    space = build_space(TuneOptions(space_preset="full"), kernel)
    assert isinstance(space, BuiltinSearchSpace)
    dims = space.dimensions()
    assert dims["codegen_opt"].describe() == {"type": "fixed", "value": 3, "size": 1}
    assert not {"specialize", "specialize_dims", "set_launch_bounds", "min_blocks_per_sm"} & set(dims)
    knobs = space.describe_extra()["builtin"]["knobs"]
    assert knobs["apply"] == ["block_shape"]
    assert "recorded without PTX" in knobs["refused"]["codegen_opt"]


@pytest.mark.parametrize("flags, named", [
    ({"fixed_codegen_opt": 1}, "codegen_opt (--fixed-codegen-opt)"),
    ({"launch_bounds_space": "on-off"}, "set_launch_bounds (--launch-bounds-space)"),
    ({"specialize_space": "on"}, "specialize (--specialize-space)"),
])
def test_asking_for_a_refused_knob_is_an_error_naming_it_and_why(flags, named):
    with pytest.raises(ConfigurationError) as err:
        build_space(TuneOptions(**flags), _kernel(ptx=False))
    assert named in str(err.value) and "without PTX" in str(err.value)


def test_the_recorded_codes_own_level_is_not_a_request():
    build_space(TuneOptions(fixed_codegen_opt=3, fixed_passes="default<O3>"), _kernel(ptx=False))
