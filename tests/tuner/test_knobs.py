"""Which built-in knobs apply to a recorded kernel: SASS-only kernels keep their launch shape only; code that
fixes its block shape keeps it, code that caps its threads per block is tuned under the cap."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from mneme.cli import main
from mneme.errors import ConfigurationError
from mneme.testing.synthetic import VecaddCode, write_vecadd_recording
from tuner.options import TuneOptions
from tuner.space.builtin import BuiltinSearchSpace
from tuner.space.factory import build_space
from tuner.space.knobs import knob_applicability


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


# -- code that fixes or caps its block shape (tests/mneme/replay/data/block_shapes.cu: nvcc __block_size__, __launch_bounds__) --

BLOCK_SHAPES = Path(__file__).parents[1] / "mneme" / "replay" / "data"


def _bounded_kernel(name: str, block: tuple[int, int, int], ptx: bool = True):
    files = {"ptx": (BLOCK_SHAPES / "block_shapes.ptx").read_bytes(),
             "cubin": (BLOCK_SHAPES / "block_shapes.sm_90.cubin").read_bytes()}
    code = SimpleNamespace(ptx="ref" if ptx else None, cubin="ref", bitcode=None)
    return SimpleNamespace(kernel_name=name, code=code, load_code=files.__getitem__, grid_dim=(64, 1, 1),
                           block_dim=block, shared_mem=0)


@pytest.mark.parametrize("ptx, source", [(True, "PTX .reqntid 128, 1, 1"), (False, "cubin EIATTR_REQNTID 128, 1, 1")])
def test_code_that_fixes_its_block_refuses_block_shape_tuning_by_name(ptx, source):
    kernel = _bounded_kernel("vecadd_fixed", (128, 1, 1), ptx)
    knobs = knob_applicability(kernel)
    assert "block_shape" not in knobs.applies
    assert "exactly 128x1x1" in knobs.refused["block_shape"] and source in knobs.refused["block_shape"]
    space = build_space(TuneOptions(space_preset="full"), kernel)
    assert space.dimensions()["block_shape"].describe() == {"type": "fixed", "value": "128x1x1", "size": 1}
    assert space.describe_extra()["builtin"]["knobs"]["refused"]["block_shape"] == knobs.refused["block_shape"]
    with pytest.raises(ConfigurationError) as err:
        build_space(TuneOptions(launch_dim="x"), kernel)
    assert "block_shape (--launch-dim)" in str(err.value) and "exactly 128x1x1" in str(err.value)
    build_space(TuneOptions(launch_dim="none"), kernel)  # the recorded shape is no request


def test_code_that_caps_its_threads_keeps_block_shapes_under_the_cap():
    capped = build_space(TuneOptions(launch_safety="aggressive", launch_dim="x"),
                         _bounded_kernel("vecadd_capped", (128, 1, 1)))
    threads = [shape.count for shape in capped.shapes]
    assert max(threads) == 256 and len(threads) > 3
    knobs = capped.describe_extra()["builtin"]["knobs"]
    assert "block_shape" in knobs["apply"] and "at most 256 threads" in knobs["limited"]["block_shape"]
    assert "PTX .maxntid 256, 1, 1" in knobs["limited"]["block_shape"]
    free = build_space(TuneOptions(launch_safety="aggressive", launch_dim="x"), _bounded_kernel("vecadd_free", (128, 1, 1)))
    assert max(shape.count for shape in free.shapes) == 1024 and "limited" not in free.describe_extra()["builtin"]["knobs"]


def test_print_space_of_a_recording_whose_code_fixes_its_block(tmp_path, capsys):
    code = VecaddCode(kernel_name="vecadd_fixed", demangled="vecadd_fixed",
                      ptx=(BLOCK_SHAPES / "block_shapes.ptx").read_text(),
                      cubin=(BLOCK_SHAPES / "block_shapes.sm_90.cubin").read_bytes())
    recording = write_vecadd_recording(tmp_path / "rec", n=4096, block=128, code=code)
    assert main(["tune", "-rdb", recording.path, "--space-preset", "full", "--print-space"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dimensions"]["block_shape"] == {"type": "fixed", "value": "128x1x1", "size": 1}
    assert "PTX .reqntid 128, 1, 1" in doc["builtin"]["knobs"]["refused"]["block_shape"]
    assert main(["tune", "-rdb", recording.path, "--launch-dim", "x", "--print-space"]) == 2
    assert "block_shape (--launch-dim)" in capsys.readouterr().err
