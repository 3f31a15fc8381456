"""--resume continues only the run it was given: the fingerprint in config.json, --force, settings read back
from the directory, and `complete` meaning that the current space was covered."""

from __future__ import annotations

import json

import pytest

from mneme.cli import main
from tuner.results.fingerprint import differences, run_fingerprint

DB = ["-rdb", "rec/159.json", "-rid", "163"]


@pytest.fixture
def wired(cli_doubles):
    """The executors the run made (the test doubles: tuner.testing.cli_doubles)."""
    return cli_doubles


def read(path, name):
    return json.loads((path / name).read_text())


def lines(path):
    return (path / "trials.jsonl").read_text().splitlines()


def test_a_resume_with_another_preset_is_refused_saying_what_differs(tmp_path, wired, capsys):
    run = tmp_path / "run"
    assert main(["tune", *DB, "--sampler", "random", "--trials", "6", "--seed", "1", "--results-dir", str(run),
                 "--quiet"]) == 0
    config, trials = (run / "config.json").read_text(), lines(run)
    capsys.readouterr()
    assert main(["tune", *DB, "--space-preset", "launch", "--sampler", "tpe", "--trials", "30", "--resume",
                 "--results-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mneme tune: error: --resume: {run} holds a run whose trials mean something else")
    # Optuna's own judgement of the distributions, and the change
    assert "dimension passes: CategoricalDistribution does not support dynamic value space." in err
    assert "dimension codegen_opt: not in the search space any more" not in err  # a fixed dimension: changed
    assert "dimension codegen_opt" in err and "--force" in err
    assert (run / "config.json").read_text() == config and lines(run) == trials  # nothing written
    assert len(wired) == 1  # no executor for the refused resume


def test_an_exhaustive_resume_of_another_space_cannot_mix_the_spaces(tmp_path, wired, capsys):
    run = tmp_path / "run"
    assert main(["tune", *DB, "--space-preset", "launch", "--launch-dim", "x", "--results-dir", str(run),
                 "--quiet"]) == 0
    assert main(["tune", *DB, "--space-preset", "launch", "--launch-dim", "x", "--launch-safety", "aggressive",
                 "--resume", "--results-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert "dimension block_shape" in err and "built-in space setting launch_safety: balanced -> aggressive" in err


def test_settings_are_compared_before_any_server_starts(tmp_path, wired, capsys):
    run = tmp_path / "run"
    assert main(["tune", *DB, "--space-preset", "launch", "--results-dir", str(run), "--quiet"]) == 0
    for flags, said in ((["--metric", "median"], "--metric: mean -> median"),
                        (["--iterations", "9"], "--iterations: 5 -> 9"),
                        (["--objective", "speedup"], "--objective: time -> speedup"),
                        (["--tolerance", "exact"], "--tolerance: auto -> exact"),
                        (["-rid", "999"], "--record-id: 163 -> 999")):
        assert main(["tune", "--resume", "--results-dir", str(run), *flags]) == 2
        assert said in capsys.readouterr().err
    assert len(wired) == 1


def test_resume_with_the_directory_alone_reads_its_settings(tmp_path, wired, capsys):
    run = tmp_path / "run"
    assert main(["tune", *DB, "--space-preset", "launch", "--launch-dim", "x", "--sampler", "tpe",
                 "--trials", "5", "--seed", "3", "--metric", "min", "--results-dir", str(run), "--quiet"]) == 0
    assert main(["tune", "--resume", "--results-dir", str(run), "--trials", "9"]) == 0
    records = [json.loads(line) for line in lines(run)]
    assert len(records) == 9 == len({r["hash"] for r in records})
    config = read(run, "config.json")
    assert config["metric"] == "min" and config["sampler"] == "tpe" and config["resume"] is True
    assert config["space_preset"] == "launch" and config["trials"] == 9
    assert "resuming: 5 trials already in" in capsys.readouterr().out


def test_resume_of_a_directory_without_a_run(tmp_path, wired, capsys):
    assert main(["tune", "--resume", "--results-dir", str(tmp_path / "none")]) == 2
    assert "--record-database is required" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["tune", *DB, "--resume", "--results-dir", str(tmp_path / "empty")]) == 2
    assert "holds no tuning run (no config.json)" in capsys.readouterr().err


def test_force_starts_a_new_run_beside_the_directory(tmp_path, wired, capsys):
    run = tmp_path / "run"
    assert main(["tune", *DB, "--space-preset", "launch", "--launch-dim", "x", "--results-dir", str(run),
                 "--quiet"]) == 0
    before = lines(run)
    assert main(["tune", *DB, "--space-preset", "quick", "--launch-dim", "x", "--resume", "--force",
                 "--results-dir", str(run), "--quiet"]) == 0
    err = capsys.readouterr().err
    beside = tmp_path / "run-2"
    assert f"--force: {run} holds a run with other settings" not in err  # same settings: the space differs
    assert f"--force: {run} holds a run of another kernel or search space" in err
    assert f"starting a new run in {beside}" in err
    assert lines(run) == before and read(beside, "config.json")["space_preset"] == "quick"
    assert read(beside, "config.json")["resume"] is False and read(beside, "summary.json")["complete"]
    # a new run pointed at a used directory: refused, or moved beside it with --force
    assert main(["tune", *DB, "--space-preset", "launch", "--launch-dim", "x", "--results-dir", str(run)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["tune", *DB, "--space-preset", "launch", "--launch-dim", "x", "--results-dir", str(run),
                 "--force", "--quiet"]) == 0
    assert f"starting a new run in {tmp_path / 'run-3'}" in capsys.readouterr().err


def test_a_directory_written_before_fingerprints_is_judged_by_its_files(tmp_path, wired, capsys):
    run = tmp_path / "run"
    assert main(["tune", *DB, "--space-preset", "launch", "--launch-dim", "x", "--sampler", "random",
                 "--trials", "4", "--results-dir", str(run), "--quiet"]) == 0
    config = read(run, "config.json")
    del config["fingerprint"]
    (run / "config.json").write_text(json.dumps(config))
    assert main(["tune", "--resume", "--results-dir", str(run), "--trials", "6", "--quiet"]) == 0
    assert len(lines(run)) == 6
    config = read(run, "config.json")
    del config["fingerprint"]
    (run / "config.json").write_text(json.dumps(config))
    assert main(["tune", "--resume", "--results-dir", str(run), "--space-preset", "quick", "--trials", "8"]) == 2
    assert "dimension block_shape" in capsys.readouterr().err


def test_complete_means_every_point_of_the_current_space(tmp_path, wired):
    run = tmp_path / "tpe"
    assert main(["tune", *DB, "--space-preset", "launch", "--launch-dim", "x", "--sampler", "tpe", "--trials", "4",
                 "--results-dir", str(run), "--quiet"]) == 0
    summary = read(run, "summary.json")
    assert summary["stopped"] == "budget" and summary["finished"] and not summary["complete"]
    coverage = summary["coverage"]
    assert coverage["evaluated"] == 4 and coverage["configurations"] == read(run, "search_space.json")["size"]
    assert coverage["missing"] == coverage["configurations"] - 4 - coverage["banned"]
    assert main(["tune", "--resume", "--results-dir", str(run), "--trials", "100", "--quiet"]) == 0
    summary = read(run, "summary.json")
    assert summary["complete"] and summary["coverage"]["missing"] == 0 and summary["stopped"] == "exhausted"


def test_fingerprint_differences():
    space = {"class": "S", "dimensions": {
        "x": {"type": "int", "low": 1, "high": 8, "step": 1, "log": False, "size": 8},
        "p": {"type": "categorical", "choices": ["a", "b"], "size": 2}}, "baseline": {"block": {"x": 1}}}
    settings = {"objective": "time", "metric": "mean", "iterations": 5, "warmup": 2, "tolerance": "auto",
                "tolerance_runs": 8, "sampler": "tpe", "secondary_objective": "registers"}
    kernel = {"name": "k", "static_hash": "1", "record_id": "2"}
    old = run_fingerprint(settings, kernel, space)
    assert differences(old, run_fingerprint({**settings, "sampler": "random", "seed": 4}, kernel, space)) == []
    wider = json.loads(json.dumps(space))
    wider["dimensions"]["x"].update(high=16, size=16)
    assert differences(old, run_fingerprint(settings, kernel, wider)) == ["dimension x: 1..8 -> 1..16"]
    logged = json.loads(json.dumps(space))
    logged["dimensions"]["x"]["log"] = True
    (line,) = differences(old, run_fingerprint(settings, kernel, logged))
    assert line.startswith("dimension x: Cannot set different log configuration to the same parameter name.")
    assert differences(old, run_fingerprint({**settings, "sampler": "nsga2"}, kernel, space)) == [
        "--secondary-objective: null -> registers"]
