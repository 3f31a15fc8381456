"""Settings: YAML file, command line over file, validation, --dump-config round trip."""

from __future__ import annotations

import argparse

import pytest

from mneme.errors import ConfigurationError
from mneme.model.verification import VerificationSettings
from replay_server.client.connection import ConnectionSettings
from tuner.cli_args import add_arguments
from tuner.options import parse_space_args, resolve_options
from tuner.run import dump_options
from tuner.space.factory import builtin_settings

REQUIRED = {"record_database": "db.json", "record_id": "42"}


def cli(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return vars(parser.parse_args(list(argv)))


def test_defaults_match_the_reference():
    o = resolve_options(REQUIRED)
    assert (o.sampler, o.metric, o.objective, o.warmup, o.iterations, o.workers) == ("exhaustive", "mean", "time", 2, 5, 1)
    assert o.space_preset == "standard" and o.adaptive_invalid_ban and not o.fail_fast


def test_reference_cli_example_parses():
    given = cli("--record-database", "rec/159.json", "--record-id", "163", "--space-preset", "launch",
                "--launch-dim", "x", "--launch-safety", "aggressive", "--passes", "default<O1>", "default<O2>",
                "default<O3>", "default<Os>", "default<Oz>", "--fixed-codegen-opt", "3", "--sampler", "exhaustive",
                "--iterations", "5", "--warmup", "2", "--workers", "1", "--metric", "mean", "--objective", "time",
                "--results-dir", "out")
    o = resolve_options(given)
    s = builtin_settings(o)
    assert s.launch_dim == "x" and s.launch_safety == "aggressive" and len(s.passes) == 5 and s.codegen_opt == [3]


def test_short_flags():
    o = resolve_options(cli("-rdb", "a.json", "-rid", "7"))
    assert o.record_database == "a.json" and o.record_id == "7"


def test_command_line_overrides_config_file(tmp_path):
    cfg = tmp_path / "config.yml"
    cfg.write_text(
        "record_database: rec/159.json\nrecord_id: \"163\"\nspace_preset: launch\nlaunch_dim: x\n"
        "passes:\n  - default<O1>\n  - default<O3>\nfixed_codegen_opt: 3\nsampler: exhaustive\n"
        "iterations: 5\nwarmup: 2\nmetric: mean\nresults_dir: from-file\n"
    )
    o = resolve_options(cli("--metric", "median", "--results-dir", "from-cli"), cfg)
    assert o.metric == "median" and o.results_dir == "from-cli"
    assert o.record_id == "163" and o.passes == ["default<O1>", "default<O3>"] and o.iterations == 5


def test_config_file_errors_are_clear(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("samplr: tpe\n")
    with pytest.raises(ConfigurationError, match="unknown settings \\['samplr'\\]"):
        resolve_options(REQUIRED, bad)
    with pytest.raises(ConfigurationError, match="cannot read"):
        resolve_options(REQUIRED, tmp_path / "missing.yml")
    bad.write_text("sampler: [unclosed\n")
    with pytest.raises(ConfigurationError, match="not valid YAML"):
        resolve_options(REQUIRED, bad)


@pytest.mark.parametrize("given,message", [
    ({"sampler": "tpe"}, "needs --trials"),
    ({"sampler": "random"}, "needs --trials"),
    ({"sampler": "grid", "trials": 10}, "takes no --trials"),
    ({"sampler": "exhaustive", "trials": 10}, "takes no --trials"),
    ({"passes": ["default<O3>"], "fixed_passes": "default<O2>"}, "contradict"),
    ({"codegen_opt_range": [1, 3], "fixed_codegen_opt": 2}, "contradict"),
    ({"space_module": "m.py:S", "launch_dim": "x"}, "--launch-dim configure the built-in space"),
    ({"space_args": ["a=1"]}, "give --space-module"),
    ({"resume": True}, "give its --results-dir"),
    ({"iterations": 0}, "at least 1"),
    ({"codegen_opt_range": "3..1"}, "LOW is above HIGH"),
    ({"launch_safety": "reckless"}, "choose one of"),
    ({"secondary_objective": "binary-size"}, "nsga2"),
    ({"tolerance": "loose"}, "--tolerance 'loose': expected exact, auto or NAME_OR_BASE"),
    ({"tolerance": ["acc=f32:often:1"]}, "often"),
    ({"tolerance_runs": 1}, "--tolerance-runs must be at least 2"),
    ({"tolerance_policies": "acc=f32:ulp:1"}, "map region selectors"),
])
def test_invalid_settings_are_refused(given, message):
    with pytest.raises(ConfigurationError, match=message):
        resolve_options({**REQUIRED, **given})


def test_tolerance_takes_what_mneme_replay_takes(tmp_path):
    policies = tmp_path / "policies.json"
    policies.write_text('{"out": {"dtype": "f32", "mode": "relative", "threshold": 1e-6}, "acc": "bitwise"}')
    o = resolve_options({**REQUIRED, **cli("--tolerance", "acc=f32:ulp:16", "--tolerance", "exact",
                                           "--tolerance-file", str(policies), "--tolerance-runs", "12")})
    assert o.verification.mode == "exact" and o.verification.runs == 12
    assert o.verification.overrides == {"out": {"dtype": "f32", "mode": "relative", "threshold": 1e-6},
                                        "acc": "f32:ulp:16"}  # the flag wins over the file
    default = resolve_options({**REQUIRED, **cli("--tolerance", "0x7f00=f64:absolute:1e-9")})
    assert default.verification.mode == "auto" and default.verification.runs == 8  # a policy alone keeps the mode


def test_tolerance_policies_of_the_command_line_join_the_config_files(tmp_path):
    cfg = tmp_path / "config.yml"
    cfg.write_text("record_database: db.json\ntolerance: [exact, 'acc=f32:ulp:4', 'out=bitwise']\n"
                   "tolerance_runs: 16\n")
    o = resolve_options(cli("--tolerance", "acc=f32:ulp:64"), cfg)
    assert o.verification.mode == "exact" and o.verification.runs == 16
    assert o.verification.overrides == {"acc": "f32:ulp:64", "out": "bitwise"}
    assert resolve_options(cli("--tolerance", "auto"), cfg).verification.mode == "auto"
    dumped = tmp_path / "dumped.yml"
    dump_options(o, str(dumped))
    assert resolve_options({}, dumped).to_dict() == {**o.to_dict(), "dump_config": None}


def test_record_is_required_except_for_dump_config(tmp_path):
    with pytest.raises(ConfigurationError, match="--record-database is required"):
        resolve_options({})
    assert resolve_options({"dump_config": str(tmp_path / "c.yml")}).record_id is None


def test_space_args_are_json_decoded():
    assert parse_space_args(["tile=32", "name=fast", "sizes=[1, 2]", "flag=true"]) == {
        "tile": 32, "name": "fast", "sizes": [1, 2], "flag": True}
    with pytest.raises(ConfigurationError, match="KEY=VALUE"):
        parse_space_args(["novalue"])


def test_ranges_accept_pairs_and_strings():
    o = resolve_options({**REQUIRED, "codegen_opt_range": "1..2", "min_blocks_per_sm_range": [2, 4]})
    s = builtin_settings(o)
    assert s.codegen_opt == [1, 2] and s.min_blocks_per_sm == [2, 3, 4]


def test_dump_config_round_trips(tmp_path):
    o = resolve_options({**REQUIRED, "sampler": "tpe", "trials": 30, "passes": ["default<O2>"], "seed": 4})
    for name in ("c.yml", "c.json"):
        path = tmp_path / name
        dump_options(o, str(path))
        again = resolve_options({}, path)
        assert again.to_dict() == {**o.to_dict(), "dump_config": None}


def test_pipeline_file(tmp_path):
    f = tmp_path / "pipelines.txt"
    f.write_text("# mine\ndefault<O2>\n\ninstcombine,simplifycfg  # custom\ndefault<O2>\n")
    s = builtin_settings(resolve_options({**REQUIRED, "pipeline_file": str(f)}))
    assert s.passes == ["default<O2>", "instcombine,simplifycfg"]


def test_connection_and_verification_flags_become_two_settings_objects(tmp_path):
    o = resolve_options({**REQUIRED, **cli("--servers", "a:1", "b:2", "--token-file", "tok", "--tls-ca", "ca.pem",
                                           "--tls-server-name", "gpu", "--tolerance", "exact", "--tolerance-runs", "4",
                                           "--no-relocate")})
    assert o.connection == ConnectionSettings(servers=["a:1", "b:2"], token_file="tok", tls_ca="ca.pem",
                                              tls_server_name="gpu")
    assert o.verification == VerificationSettings(mode="exact", runs=4, relocate=False)
    flat = o.to_dict()  # config.json and --dump-config keep the flags' names
    assert {k: flat[k] for k in ("servers", "token_file", "tolerance", "tolerance_runs", "no_relocate")} == {
        "servers": ["a:1", "b:2"], "token_file": "tok", "tolerance": "exact", "tolerance_runs": 4, "no_relocate": True}
    assert "connection" not in flat and "verification" not in flat
    dumped = tmp_path / "c.yml"
    dump_options(o, str(dumped))
    again = resolve_options({}, dumped)
    assert (again.connection, again.verification) == (o.connection, o.verification)
    local = resolve_options({**REQUIRED, **cli("--keep-servers", "--server-engine", "pkg.engine:spec")})
    assert local.connection.keep_alive == 600 and local.connection.local_server_gpus() == [0]
    assert local.connection.local_server_args() == ["--engine", "pkg.engine:spec"]
    assert resolve_options(REQUIRED).connection == ConnectionSettings()  # local servers
    with pytest.raises(ConfigurationError, match="--keep-servers keeps the local servers"):
        resolve_options({**REQUIRED, **cli("--keep-servers", "--servers", "a:1")})
