"""The reference's module names: declared in the distribution's metadata, resolved on first import to the
modules that hold the code, with no file of the core naming a package above it."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from mneme._internal import reference_names

REPO = Path(__file__).resolve().parents[3]
EXPECTED = {
    "mneme.mneme_types": "mneme.model.experiment",
    "mneme.recorded_execution": "mneme.recording.execution",
    "mneme.async_executor": "replay_server.client.executor",
    "mneme.tuning.search_space": "tuner.space.search_space",
    "mneme.tuning.sample_strategy": "tuner.strategies.sample_strategy",
}


def declared() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return dict(project["entry-points"][reference_names.GROUP])


def test_pyproject_declares_the_reference_names_and_no_file_of_the_core_holds_one():
    assert declared() == EXPECTED
    for name in EXPECTED:
        relative = Path(*name.split("."))
        assert not (REPO / relative).with_suffix(".py").exists() and not (REPO / relative).exists(), name


def test_the_installed_distribution_carries_the_table():
    assert reference_names.reference_names() == EXPECTED


@pytest.mark.parametrize("name, target", sorted(EXPECTED.items()))
def test_each_name_is_the_module_that_holds_the_code(name, target):
    assert importlib.import_module(name) is importlib.import_module(target)


def test_the_reference_scripts_imports_work_and_a_parent_holds_only_reference_names():
    from mneme.async_executor import AsyncReplayExecutor
    from mneme.mneme_types import ExperimentConfiguration
    from mneme.recorded_execution import RecordedExecution
    from mneme.tuning.sample_strategy import ExhaustiveSamplingStrategy
    from mneme.tuning.search_space import SearchSpace

    assert AsyncReplayExecutor.__module__ == "replay_server.client.executor"
    assert ExperimentConfiguration and RecordedExecution and ExhaustiveSamplingStrategy and SearchSpace
    import mneme.tuning

    assert mneme.tuning.__path__ == [] and "mneme.tuning.search_space" in mneme.tuning.__doc__
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("mneme.tuning.space")  # the tuner's other modules are not mirrored
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("mneme.no_such_module")


def test_importing_mneme_imports_no_package_above_the_core(tmp_path):
    # From a folder without a checkout: the installed package, as users import it.
    probe = ("import sys, mneme; "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'record_agent', 'replay_server', 'tuner'}))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
