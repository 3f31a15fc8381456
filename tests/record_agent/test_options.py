"""Settings of a recording run: --instances, -rr, ranks, validation, the recorder's environment."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mneme.cli import build_parser
from mneme.errors import ConfigurationError
from mneme.recording.window import DEFAULT_VA_BASE, FALLBACK_VA_BASES
from record_agent.options import (
    InstanceSlice,
    RecordOptions,
    parse_instances,
    parse_ranks,
)
from record_agent.ranks import detect_rank, rank_selected


def test_instance_spec_forms():
    spec = parse_instances("0, 5-7, 100::50, :3")
    assert spec == (InstanceSlice(0, 1, 1), InstanceSlice(5, 8, 1), InstanceSlice(100, None, 50), InstanceSlice(0, 3, 1))
    chosen = [i for i in range(300) if any(s.contains(i) for s in spec)]
    assert chosen == [0, 1, 2, 5, 6, 7, 100, 150, 200, 250]
    assert [s.encode() for s in spec] == ["0:1:1", "5:8:1", "100::50", "0:3:1"]


@pytest.mark.parametrize("bad", ["", "x", "5-2", "1:2:0", "1:2:3:4", "-1"])
def test_instance_spec_errors_say_what_to_write(bad):
    with pytest.raises(ConfigurationError, match="--instances"):
        parse_instances(bad)


def test_rank_selection():
    assert parse_ranks("all") is None and parse_ranks("0, 2,5") == frozenset({0, 2, 5})
    with pytest.raises(ConfigurationError, match="rank number"):
        parse_ranks("0,two")
    assert detect_rank({}) is None
    assert detect_rank({"OMPI_COMM_WORLD_RANK": "3", "PMI_RANK": "1"}) == 3
    assert detect_rank({"SLURM_PROCID": "2", "OMPI_COMM_WORLD_RANK": "3"}) == 2
    assert detect_rank({"FLUX_TASK_RANK": "7"}) == 7 and detect_rank({"PMIX_RANK": "x"}) is None
    assert rank_selected(None, frozenset({0})) and rank_selected(4, None)
    assert rank_selected(0, frozenset({0})) and not rank_selected(1, frozenset({0}))


def test_validation_collects_every_problem():
    with pytest.raises(ConfigurationError) as info:
        RecordOptions(command=(), record_db_dir="d", vass_gib=0, skip_recordings=-1, kernel_regexes=("(",), snapshot_scope="some")
    text = str(info.value)
    for part in ("after '--'", "-vass", "-sr", "--kernel", "--snapshot-scope"):
        assert part in text


def test_recorder_environment():
    opts = RecordOptions(
        command=("./app",), record_db_dir="d", vass_gib=1.001, kernel_regexes=("relax", "^_Z3foo"),
        instances=parse_instances("0,10::5"), devices=(1,), max_recordings=0, snapshot_scope="reachable",
    )
    env = opts.recorder_environment("/spool", 3)
    assert env["MNEME_SPOOL_DIR"] == "/spool" and env["MNEME_RANK"] == "3"
    assert env["MNEME_VA_BASE"] == "0x200000000000"
    assert int(env["MNEME_VA_SIZE"]) % (2 << 20) == 0 and int(env["MNEME_VA_SIZE"]) >= 1.001 * (1 << 30)
    assert env["MNEME_KERNEL_REGEX"] == "relax\n^_Z3foo" and env["MNEME_INSTANCES"] == "0:1:1,10::5"
    assert env["MNEME_DEVICES"] == "1" and env["MNEME_MAX"] == "0" and env["MNEME_SNAPSHOT_SCOPE"] == "reachable"


def test_cli_parses_the_reference_flags():
    args = build_parser().parse_args(
        ["record", "-rdb", "out", "-vass", "8", "--kernel", "a", "--kernel", "b", "-sr", "2", "-mr", "3",
         "--instances", "0,4", "--snapshot-scope", "reachable", "--max-snapshot-bytes", "2G", "-rr", "all",
         "--device", "1", "--", "./app", "-x", "--flag"]
    )
    assert args.record_db_dir == "out" and args.vass == 8.0 and args.kernel == ["a", "b"]
    assert (args.skip_recordings, args.max_recordings, args.max_snapshot_bytes) == (2, 3, 2 << 30)
    assert args.record_ranks == "all" and args.device == [1]
    assert args.command == ["--", "./app", "-x", "--flag"]  # the application's own flags stay its own


def test_cli_defaults_match_the_reference():
    args = build_parser().parse_args(["record", "-rdb", "out", "--", "./app"])
    assert (args.vass, args.skip_recordings, args.max_recordings, args.record_ranks) == (4.0, 0, 4, "0")


def test_cli_bad_size_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["record", "-rdb", "o", "--max-snapshot-bytes", "lots", "--", "x"])
    assert "not a size" in capsys.readouterr().err


def test_module_loading_stays_lazy_unless_eager_loading_is_asked_for(monkeypatch, tmp_path):
    from record_agent.session import application_environment

    lib = tmp_path / "libmneme_recorder.so"
    lib.write_bytes(b"")
    base = {"MNEME_RECORDER_LIB": str(lib), "PATH": "/usr/bin"}
    args = build_parser().parse_args(["record", "-rdb", "out", "--", "./app"])
    assert args.snapshot_scope == "auto" and not args.eager_loading
    lazy = application_environment(RecordOptions(command=("./app",), record_db_dir="d"), "/spool", None, base)
    assert "CUDA_MODULE_LOADING" not in lazy and lazy["MNEME_SNAPSHOT_SCOPE"] == "auto"
    eager = application_environment(RecordOptions(command=("./app",), record_db_dir="d", eager_loading=True), "/spool",
                                    None, base)
    assert eager["CUDA_MODULE_LOADING"] == "EAGER"
    assert build_parser().parse_args(["record", "-rdb", "o", "--eager-loading", "--", "x"]).eager_loading


def test_the_native_recorder_defaults_to_the_same_window_bases():
    """settings.hpp's default base and memory_window.cpp's fallbacks are the ones record_agent names
    (mneme record always passes MNEME_VA_BASE, but the recorder preloaded by hand uses its own)."""
    native = Path(__file__).resolve().parents[2] / "native"
    src = native / "recorder" / "src"
    settings = native / "common" / "include" / "mneme" / "common" / "settings.hpp"
    default = re.search(r"uint64_t va_base = (0x[0-9a-f]+)ull;", settings.read_text())
    fallbacks = re.search(r"kFallbackBases\[\] = \{([^}]*)\}", (src / "memory_window.cpp").read_text())
    assert default and int(default.group(1), 16) == DEFAULT_VA_BASE
    assert fallbacks and tuple(int(re.sub(r"ull$", "", v.strip()), 16) for v in fallbacks.group(1).split(",")) == FALLBACK_VA_BASES
    assert DEFAULT_VA_BASE not in FALLBACK_VA_BASES


def test_durability_is_off_unless_asked_for():
    from record_agent.session import record_durability

    assert not build_parser().parse_args(["record", "-rdb", "o", "--", "x"]).durable
    assert build_parser().parse_args(["record", "-rdb", "o", "--durable", "--", "x"]).durable
    plain, durable = RecordOptions(command=("x",), record_db_dir="o"), RecordOptions(command=("x",), record_db_dir="o", durable=True)
    assert record_durability(plain, {}) == "none" and record_durability(durable, {}) == "commit"
    assert record_durability(plain, {"MNEME_RECORD_SYNC": "1"}) == "object"  # an fsync per object, as before
