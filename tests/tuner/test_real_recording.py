"""The tuner on a real (synthetic, CPU-written) recording: loading, identity, spaces, the example."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mneme.cli import main
from mneme.recording.execution import RecordedExecution
from mneme.testing.synthetic import write_vecadd_recording
from tuner.recording import load_instance
from tuner.space.factory import load_space_class
from tuner.strategies.sample_strategy import ExhaustiveSamplingStrategy

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tuning_vecadd_exhaustive.py"
N = 10_000


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    return write_vecadd_recording(tmp_path_factory.mktemp("rec"), n=N, block=256)


def test_load_instance_names_the_kernel(recording):
    kernel, identity = load_instance(recording.path, recording.dynamic_hash)
    assert kernel.block_dim.x == 256 and kernel.grid_dim.x == -(-N // 256)
    assert identity.static_hash == recording.static_hash and identity.record_id == recording.dynamic_hash
    assert "vecadd" in identity.name.lower()


def test_unknown_instance_and_missing_database_are_clear(recording, tmp_path, capsys):
    assert main(["tune", "-rdb", recording.path, "-rid", "123", "--print-space"]) == 2
    assert "123" in capsys.readouterr().err
    assert main(["tune", "-rdb", str(tmp_path / "none.json"), "-rid", "1", "--print-space"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_tune_without_record_id_picks_the_only_instance(recording, capsys):
    assert main(["tune", "-rdb", recording.path, "--space-preset", "launch", "--launch-dim", "x", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["baseline"]["block"]["x"] == 256


def test_tune_without_record_id_lists_the_choices_when_there_are_several(tmp_path, capsys):
    several = write_vecadd_recording(tmp_path / "several", n=N, block=256, instances=2)
    assert main(["tune", "-rdb", several.path, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "2 instances" in err and "--record-id" in err
    assert all(record_id in err for record_id in several.dynamic_hashes)
    assert main(["tune", "-rdb", several.path, "-rid", several.dynamic_hashes[1], "--dry-run"]) == 0


def test_print_space_of_the_launch_preset(recording, capsys):
    assert main(["tune", "-rdb", recording.path, "-rid", recording.dynamic_hash, "--space-preset", "launch",
                 "--launch-dim", "x", "--launch-safety", "aggressive", "--print-space"]) == 0
    doc = json.loads(capsys.readouterr().out)
    shapes = doc["dimensions"]["block_shape"]["choices"]
    assert shapes[0] == "256x1x1" and "1024x1x1" in shapes
    assert doc["builtin"]["recorded"]["total_threads"]["x"] == -(-N // 256) * 256
    assert doc["baseline"]["block"]["x"] == 256 and doc["baseline"]["codegen_opt"] == 3


def test_example_space_through_the_cli(recording, capsys):
    assert main(["tune", "-rdb", recording.path, "-rid", recording.dynamic_hash, "--space-module",
                 f"{EXAMPLE}:EntireSpace", "--dry-run"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["search_space"]["size"] == 80 and doc["baseline"]["block"]["x"] == 256


def test_example_space_enumerates_80_covering_configurations(recording):
    space_class = load_space_class(f"{EXAMPLE}:EntireSpace")
    kernel = RecordedExecution.from_json(recording.path)[recording.dynamic_hash]
    configs = list(ExhaustiveSamplingStrategy(space_class(kernel)))
    assert len(configs) == 80 and all(c.is_valid() for c in configs)
    total = kernel.grid_dim.x * kernel.block_dim.x
    assert all(c.grid.x * c.block.x >= total > (c.grid.x - 1) * c.block.x for c in configs)


def test_space_module_errors(tmp_path, recording, capsys):
    base = ["tune", "-rdb", recording.path, "-rid", recording.dynamic_hash, "--print-space", "--space-module"]
    assert main(base + ["nowhere.py:Space"]) == 2
    assert "no file" in capsys.readouterr().err
    assert main(base + [f"{EXAMPLE}:Missing"]) == 2
    assert "no class 'Missing'" in capsys.readouterr().err
    assert main(base + [f"{EXAMPLE}"]) == 2
    assert "MODULE_OR_PATH:CLASS" in capsys.readouterr().err
    assert main(base + [f"{EXAMPLE}:EntireSpace", "--space-arg", "tile=3"]) == 2
    assert "--space-arg" in capsys.readouterr().err
    assert main(base + ["json:JSONDecoder"]) == 2
    assert "not a tuner.space.search_space.SearchSpace" in capsys.readouterr().err


def test_without_bitcode_the_preset_keeps_only_the_default_pipeline(recording, capsys):
    base = ["tune", "-rdb", recording.path, "-rid", recording.dynamic_hash, "--print-space"]
    assert main(base + ["--space-preset", "standard"]) == 0
    assert json.loads(capsys.readouterr().out)["dimensions"]["passes"] == {
        "type": "fixed", "value": "default<O3>", "size": 1}
    assert main(base + ["--space-preset", "standard", "--passes", "default<O2>", "default<O3>"]) == 0
    assert json.loads(capsys.readouterr().out)["dimensions"]["passes"]["choices"] == ["default<O2>", "default<O3>"]


def test_explicit_tolerance_policies_must_select_recorded_regions(recording, capsys):
    assert main(["tune", "-rdb", recording.path, "--tolerance", "cc=f32:ulp:4", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--tolerance cc: no recorded region" in err and "a, b, c" in err
    rec = RecordedExecution.from_json(recording.path)
    a_base = hex(rec.single_instance().load_prologue().region_named("a").base)
    assert main(["tune", "-rdb", recording.path, "--tolerance", "c=f32:ulp:4", "--tolerance",
                 f"{a_base}=bitwise", "--dry-run"]) == 0  # by name, and a's recorded base
