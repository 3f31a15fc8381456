"""Child processes import the mneme of their parent, not a `mneme/` source tree in the current directory."""

from __future__ import annotations

import os
import subprocess

import pytest

from mneme._internal import child_process
from mneme._internal.child_process import PACKAGE_ROOT, child_env, mneme_command
from mneme.model.experiment import ExperimentConfiguration
from replay_server.client.connection import ConnectionSettings
from replay_server.client.executor import AsyncReplayExecutor
from replay_server.testing.servers import (  # noqa: F401
    ENGINE_ARGS,
    RECORD_DB,
    RECORD_ID,
    store,
    subprocess_env,
)


@pytest.fixture
def decoy_cwd(tmp_path, monkeypatch):
    """A current directory holding `mneme/` and `replay_server/` trees that fail on import."""
    root = tmp_path / "checkout"
    for package in ("mneme", "replay_server"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text(f"raise ImportError('the decoy {package} of the cwd was imported')\n")
        (root / package / "__main__.py").write_text("raise SystemExit('the decoy __main__ ran')\n")
    monkeypatch.chdir(root)
    return root


def test_the_decoy_shadows_a_plain_python_m(decoy_cwd):
    """What the decoy proves: a plain `python -m mneme` from there runs the decoy."""
    import sys

    plain = subprocess.run([sys.executable, "-m", "mneme", "serve", "--help"], capture_output=True, text=True,
                           env=child_env())
    assert plain.returncode != 0 and "decoy" in plain.stderr


def test_a_child_command_imports_the_parents_mneme(decoy_cwd):
    done = subprocess.run(mneme_command("serve", "--help"), capture_output=True, text=True, env=child_env())
    assert done.returncode == 0, done.stderr
    assert "--gpu" in done.stdout


def test_child_env_puts_the_parents_mneme_first(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/elsewhere", PACKAGE_ROOT]))
    # mneme imported from a source tree (PYTHONPATH=$PWD, tests): that tree leads the child's path.
    monkeypatch.setattr(child_process, "_site_directories", lambda: set())
    paths = child_env({"X": "1"})["PYTHONPATH"].split(os.pathsep)
    assert paths == [PACKAGE_ROOT, "/elsewhere"] and child_env({"X": "1"})["X"] == "1"
    # mneme installed in site-packages: the child finds it there; PYTHONPATH is left as it was.
    monkeypatch.setattr(child_process, "_site_directories", lambda: {PACKAGE_ROOT})
    assert child_env()["PYTHONPATH"] == os.pathsep.join(["/elsewhere", PACKAGE_ROOT])


def test_local_servers_workers_and_compile_processes_start_from_a_decoy_cwd(store, tmp_path, decoy_cwd):
    """The executor's local server (and the workers and compile processes it spawns) run the real mneme."""
    with AsyncReplayExecutor(
        record_db=str(store / RECORD_DB), record_id=RECORD_ID, iterations=3, num_workers=1,
        connection=ConnectionSettings(local_gpus=[0], server_args=[*ENGINE_ARGS, "--compile-processes", "1"],
                                      server_env=subprocess_env(tmp_path / "log")),
    ) as executor:
        executor.wait_prepared(timeout=60)
        result = executor.evaluate(ExperimentConfiguration.from_dict({"block": {"x": 64}, "passes": "default<O1>"}))
    assert result.verified, result
