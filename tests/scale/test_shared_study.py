"""Shared Optuna studies: real tuner processes on one storage (SQLite, journal file, PostgreSQL)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna
import pytest

from mneme.errors import ConfigurationError
from mneme.model.experiment import STATUSES, ExperimentConfiguration
from tuner.results.shared_report import report_command
from tuner.space.search_space import IntRangeParam, SearchSpace
from tuner.strategies.shared_study import (
    DUPLICATE_ATTR,
    HASH_ATTR,
    SharedStudyStrategy,
    open_storage,
)
from tuner.testing import CUSTOM_SPACE

HERE = Path(__file__).resolve().parent
BLOCK_STEP, BLOCK_HIGH = 32, 512  # 16 block sizes x 2 pipelines = 32 configurations


def space_module(tmp_path: Path) -> str:
    path = tmp_path / "block_space.py"
    path.write_text(CUSTOM_SPACE)
    return f"{path}:BlockSpace"


def start_tuner(tmp_path: Path, name: str, storage: str, **settings) -> subprocess.Popen:
    settings = {"record_database": "rec/159.json", "record_id": "163", "results_dir": str(tmp_path / name),
                "space_module": space_module(tmp_path), "sampler": "random", "trials": 64,
                "optuna_storage": storage, "study_name": "shared", "delay": 0.01, "quiet": True,
                "adaptive_invalid_ban": False, **settings}
    return subprocess.Popen([sys.executable, str(HERE / "tune_process.py"), json.dumps(settings)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def trials(directory: Path) -> list[dict]:
    return [json.loads(line) for line in (directory / "trials.jsonl").read_text().splitlines()]


def run_two(tmp_path: Path, storage: str) -> tuple[list[dict], list[dict]]:
    # 0.15 s a trial: the space takes one process ~5 s, so the other (whose start may lag by a second or two
    # on a loaded CI machine) always gets a share.
    procs = [start_tuner(tmp_path, name, storage, delay=0.15) for name in ("a", "b")]
    for proc in procs:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode in (0, 1), out  # 1: this process's own trials had no verified one
    return trials(tmp_path / "a"), trials(tmp_path / "b")


def check_cooperation(tmp_path: Path, storage: str) -> None:
    a, b = run_two(tmp_path, storage)
    hashes = Counter(r["hash"] for r in a + b)
    assert len(hashes) == 32, "the two processes together cover the space"
    assert max(hashes.values()) == 1, f"evaluated twice: {[h for h, n in hashes.items() if n > 1]}"
    assert a and b, "both processes evaluated configurations"
    # What optuna-dashboard reads: the study's trials with their user attributes.
    study = optuna.load_study(study_name="shared", storage=open_storage(storage))
    evaluated = [t for t in study.get_trials() if "status" in t.user_attrs]
    assert sorted(t.user_attrs["mneme"]["hash"] for t in evaluated) == sorted(hashes)
    assert study.metric_names == ["mean_time_ns"]
    for t in evaluated:
        assert DUPLICATE_ATTR not in t.system_attrs
        assert t.state.name == ("COMPLETE" if t.user_attrs["status"] == "verified" else "FAIL")
        assert t.user_attrs["configuration"]["block"]["x"] == t.params["block_dim_x"]
        assert t.user_attrs["status"] in STATUSES
        assert (t.user_attrs["speedup"] is not None) == (t.user_attrs["status"] == "verified")
        details = t.user_attrs["mneme"]
        assert details["worker"] and details["results_dir"] in (str(tmp_path / "a"), str(tmp_path / "b"))
        assert details["metric"] is not None or t.user_attrs["status"] != "verified"
    assert not [t for t in study.get_trials() if t.state.name == "RUNNING"]
    # One merged view, from the directories and from the storage.
    out = io.StringIO()
    report_command([str(tmp_path / "a"), str(tmp_path / "b")], storage, "shared", str(tmp_path / "merged"), out)
    docs = json.loads((tmp_path / "merged" / "merged_summary.json").read_text())
    for doc in docs:
        assert doc["trials"] == doc["distinct_configurations"] == 32 and doc["evaluated_twice"] == []
        assert doc["best"]["params"]["block_dim_x"] == 128 and doc["best"]["params"]["passes"] == "default<O3>"
    assert "32 evaluated trials, 32 distinct configurations, 0 evaluated twice" in out.getvalue()


def test_two_processes_share_a_sqlite_study(tmp_path):
    check_cooperation(tmp_path, f"sqlite:///{tmp_path / 'study.db'}")


def test_two_processes_share_a_journal_file(tmp_path):
    check_cooperation(tmp_path, f"journal:{tmp_path / 'study.log'}")


def test_two_processes_share_a_postgresql_study(tmp_path, postgres_url):
    check_cooperation(tmp_path, postgres_url)


class OnePoint(SearchSpace):
    def __init__(self, values=(64,)):
        self.dims = {"block_dim_x": IntRangeParam("block_dim_x", low=min(values), high=max(values), step=64)}

    def dimensions(self):
        return self.dims

    def derived(self, params):
        return ExperimentConfiguration.from_dict({"grid": {"x": 4096 // params["block_dim_x"]},
                                                  "block": {"x": params["block_dim_x"]}})

    def baseline(self):
        return self.derived({"block_dim_x": 64})


def test_a_claimed_configuration_is_not_offered_to_another_process(tmp_path):
    storage = f"journal:{tmp_path / 'study.log'}"
    first = SharedStudyStrategy(OnePoint(), "random", storage=storage, study_name="s", seed=1)
    second = SharedStudyStrategy(OnePoint(), "random", storage=storage, study_name="s", seed=2)
    candidate = first.ask()
    assert candidate is not None and second.ask() is None  # claimed by the first: nothing left
    first.tell(candidate, [100.0])
    assert second.ask() is None and second._values[candidate.hash] == (100.0,)


def test_a_duplicate_waits_for_its_claim_and_takes_its_values(tmp_path):
    storage = f"journal:{tmp_path / 'study.log'}"
    first = SharedStudyStrategy(OnePoint((64, 128)), "random", storage=storage, study_name="s", seed=1)
    second = SharedStudyStrategy(OnePoint((64, 128)), "random", storage=storage, study_name="s", seed=1)
    mine = first.ask()
    # The second process draws the same point (same seed): its trial becomes a duplicate of the first's.
    theirs = second.ask()
    assert theirs is None or theirs.hash != mine.hash
    study = optuna.load_study(study_name="s", storage=open_storage(storage))
    waiting = [t for t in study.get_trials() if t.system_attrs.get(DUPLICATE_ATTR) == mine.number]
    assert waiting and all(t.state.name == "RUNNING" for t in waiting)
    first.tell(mine, [7.0])
    if theirs is not None:
        second.tell(theirs, [9.0])
    second.ask()  # syncs: the duplicate takes the claim's values
    study = optuna.load_study(study_name="s", storage=open_storage(storage))
    for t in study.get_trials():
        if t.system_attrs.get(DUPLICATE_ATTR) == mine.number:
            assert t.state.name == "COMPLETE" and t.values == [7.0]
        assert t.system_attrs.get(HASH_ATTR) or t.state.name == "COMPLETE"


def test_ctrl_c_releases_claims_and_resume_finishes_the_space(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    proc = start_tuner(tmp_path, "a", storage, interrupt_after=10)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    study = optuna.load_study(study_name="shared", storage=open_storage(storage))
    assert not [t for t in study.get_trials() if t.state.name == "RUNNING"], "claims were released"
    done = len(trials(tmp_path / "a"))
    assert 0 < done < 32
    proc = start_tuner(tmp_path, "a", storage, resume=True)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    hashes = Counter(r["hash"] for r in trials(tmp_path / "a"))
    assert len(hashes) == 32 and max(hashes.values()) == 1


def test_bad_storage_urls_say_what_to_give(tmp_path):
    with pytest.raises(ConfigurationError, match="journal:PATH"):
        open_storage("redis://localhost")
    with pytest.raises(ConfigurationError, match="does not exist"):
        open_storage(f"journal:{tmp_path / 'missing' / 'study.log'}")


def test_report_cli_merges_directories(tmp_path):
    a, b = run_two(tmp_path, f"journal:{tmp_path / 'study.log'}")
    out = subprocess.run([sys.executable, "-m", "mneme", "tune", "report", str(tmp_path / "a"), str(tmp_path / "b")],
                         capture_output=True, text=True, cwd=HERE.parents[1], timeout=120)
    assert out.returncode == 0, out.stderr
    assert "32 evaluated trials, 32 distinct configurations, 0 evaluated twice" in out.stdout
    assert f"{tmp_path / 'a'}: {len(a)}" in out.stdout and "BEST:" in out.stdout
