"""`mneme replay`: argument parsing, configuration files, output format, and errors without a GPU."""

from __future__ import annotations

import json

import pytest

import mneme.testing.synthetic_recordings as synth
from mneme.cli import build_parser, main
from mneme.cli import replay as cli
from mneme.errors import ConfigurationError
from mneme.recording.execution import RecordedExecution
from mneme.replay.engine import driver_available


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return synth.vecadd(tmp_path_factory.mktemp("rec"), n=4096, block=256)


def parse(*argv):
    return build_parser().parse_args(["replay", *argv])


def test_defaults_are_the_recorded_launch(db):
    args = parse("-rdb", str(db))
    inst = RecordedExecution.from_json(str(db)).single_instance()
    config = cli.build_config(args, inst)
    assert config.grid.x == 16 and config.block.x == 256 and config.passes == "default<O3>"
    assert args.iterations == 3 and args.warmup == 2 and args.record_id is None


def test_reference_flags_override(db):
    args = parse("-rdb", str(db), "-rid", "1", "default<O1>", "-gidx", "8", "-gidy", "2", "-bidx", "512",
                 "-shem", "64", "--specialize", "-slb", "--max-threads", "512", "--min-blocks-per-sm", "2",
                 "-sdims", "-co", "1", "-it", "7", "--warmup", "0", "--json")  # fmt: skip
    inst = RecordedExecution.from_json(str(db)).single_instance()
    c = cli.build_config(args, inst)
    assert (c.grid.x, c.grid.y, c.block.x, c.shared_mem) == (8, 2, 512, 64)
    assert c.specialize and c.set_launch_bounds and c.specialize_dims
    assert (c.max_threads, c.min_blocks_per_sm, c.codegen_opt, c.passes) == (512, 2, 1, "default<O1>")
    assert args.iterations == 7 and args.warmup == 0 and args.json
    assert not cli.build_config(parse("-rdb", str(db), "--no-specialize"), inst).specialize
    assert parse("-rdb", str(db)).timing == "events" and parse("-rdb", str(db), "--timing", "cupti").timing == "cupti"


def test_config_file_json_and_yaml(db, tmp_path):
    inst = RecordedExecution.from_json(str(db)).single_instance()
    j = tmp_path / "c.json"
    j.write_text(json.dumps({"Replay-config": {"block": {"x": 128}, "codegen_opt": 2}}))
    c = cli.build_config(parse("-rdb", str(db), "--config", str(j), "-co", "0"), inst)
    assert c.block.x == 128 and c.grid.x == 16 and c.codegen_opt == 0  # flags win over the file
    y = tmp_path / "c.yml"
    y.write_text("block:\n  x: 64\nspecialize: true\n")
    c = cli.build_config(parse("-rdb", str(db), "--config", str(y)), inst)
    assert c.block.x == 64 and c.specialize
    y.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigurationError, match="dict of configuration keys"):
        cli.build_config(parse("-rdb", str(db), "--config", str(y)), inst)
    with pytest.raises(ConfigurationError, match="unknown configuration keys"):
        j.write_text(json.dumps({"blocks": 1}))
        cli.build_config(parse("-rdb", str(db), "--config", str(j)), inst)


def test_output_has_the_reference_blocks():
    text = cli.format_output({"grid": {"x": 1}}, {"verified": True}, as_json=False)
    assert text.startswith('"Replay-config": {') and '\n"Result": {' in text
    assert json.loads(cli.format_output({"a": 1}, {"b": 2}, as_json=True)) == {"Replay-config": {"a": 1}, "Result": {"b": 2}}


@pytest.mark.skipif(driver_available(), reason="checks the machine-without-GPU path")
def test_without_a_gpu_it_exits_non_zero_saying_so(db, capsys):
    assert main(["replay", "-rdb", str(db)]) == 2
    err = capsys.readouterr().err
    assert "mneme replay: error:" in err
    assert "cannot replay on this machine" in err or "engine (mneme._engine) is not built" in err


def test_bad_input_exits_2_with_a_clear_message(db, tmp_path, capsys):
    assert main(["replay", "-rdb", str(db), "-bidx", "4096"]) == 2
    assert "exceeds the CUDA limit" in capsys.readouterr().err
    assert main(["replay", "-rdb", str(db), "-rid", "123"]) == 2
    assert "no instance 123" in capsys.readouterr().err
    assert main(["replay", "-rdb", str(tmp_path / "nothing.json")]) == 2
    assert main(["replay", "-rdb", str(db), "--tolerance", "c=f32:weird:1"]) == 2
    assert "mode" in capsys.readouterr().err
    assert main(["replay", "-rdb", str(db), "-it", "0"]) == 2
    assert "--iterations 0" in capsys.readouterr().err
