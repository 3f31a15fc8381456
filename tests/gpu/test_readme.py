"""The README's walkthrough is a test: its shell block, run verbatim from a copy of the checkout.

Each command of the README's Walkthrough block runs with ``bash -c`` exactly
as written, from a copy of the checkout (its ``mneme/`` source tree, without
the native parts, in the current directory: what a new user has after
``pip install .``); ``NAME=$(...)`` lines fill ``$NAME`` for the commands
after them, and nothing else is changed. Each step must exit 0; the steps
this test knows are checked further (recording listed, replays verified,
tune summary written, report written); a step added to the README later is
simply run too. Then the Python example the Walkthrough names runs the same way.

``mneme`` and ``python`` resolve to this test's interpreter: the installed
``mneme`` entry point when it runs this interpreter, else a shim that starts
it the way the entry point does (``python -P -m mneme``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from readme_walkthrough import Step, python_example, walkthrough_steps

from mneme._internal.child_process import child_env, mneme_command

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
# What a fresh checkout does not hold: build outputs, carried wheels, earlier walkthrough outputs, and
# native parts built into the source tree (the installed package has them; the checkout's mneme/ must not).
TOP_LEVEL_EXTRAS = {".git", "build", "_skbuild", ".whl", ".wt", ".spec", ".venv", "results", "recordings",
                    "mneme-tune-results"}


def not_in_a_checkout(directory: str, names: list[str]) -> set[str]:
    ignored = {n for n in names if n == "__pycache__"}
    if Path(directory) == REPO:
        ignored |= TOP_LEVEL_EXTRAS & set(names)
    if Path(directory).is_relative_to(REPO / "mneme"):
        ignored |= {n for n in names if n.endswith(".so")}
    return ignored


def _entry_point_runs_this_python() -> str | None:
    found = shutil.which("mneme")
    if found is None:
        return None
    with open(found, "rb") as script:
        first = script.readline().decode(errors="replace")
    interpreter = first[2:].strip().split()[0] if first.startswith("#!") else ""
    return found if interpreter and os.path.realpath(interpreter) == os.path.realpath(sys.executable) else None


def _bin_dir(tmp: Path) -> Path:
    """``mneme`` and ``python`` for the walkthrough: this interpreter, started as a user would start it."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    entry = _entry_point_runs_this_python()
    shims = {"python": f'exec {sys.executable} "$@"',
             "mneme": f'exec {entry} "$@"' if entry else "exec " + " ".join(mneme_command()) + ' "$@"'}
    for name, line in shims.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{line}\n")
        path.chmod(0o755)
    return bin_dir


@dataclass
class Walkthrough:
    checkout: Path
    env: dict[str, str]
    ran: list[tuple[Step, subprocess.CompletedProcess]] = field(default_factory=list)
    failure: str = ""

    def run(self, command: str, timeout: int = 600) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", command], cwd=self.checkout, env=self.env, capture_output=True,
                              text=True, timeout=timeout)


def _option(words: list[str], *names: str) -> str:
    for name in names:
        if name in words:
            return words[words.index(name) + 1]
    raise AssertionError(f"{' '.join(words)}: no {names[0]}")


def _plots_missing() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is None for m in ("matplotlib", "plotly"))


def check_step(walk: Walkthrough, step: Step, done: subprocess.CompletedProcess) -> None:
    """What a step must have done, beyond exiting 0 (which every step must)."""
    words, out = step.words, done.stdout
    what = f"`{step.text}` exited {done.returncode}:\n{out[-3000:]}\n{done.stderr[-3000:]}"
    if words[:3] == ["mneme", "tune", "report"]:
        index = walk.checkout / words[3] / "report" / "index.html"
        if done.returncode != 0 and _plots_missing():  # the README says: needs mneme[plots]
            assert "pip install 'mneme[plots]'" in done.stderr, what
            return
        assert done.returncode == 0, what
        assert index.is_file(), f"{step.text}: no {index}"
        return
    assert done.returncode == 0, what
    if words[:2] == ["mneme", "record"]:
        recorded = walk.checkout / _option(words, "-rdb", "--record-db-dir")
        assert list(recorded.glob("*.json")), f"{step.text}: no database in {recorded}"
    elif words[:2] == ["mneme", "ls"]:
        listed = re.search(r"(\d+) recording\(s\), (\d+) instance\(s\)", out)
        assert listed and int(listed.group(1)) >= 1 and "vecadd" in out, what
    elif words[:2] == ["mneme", "replay"]:
        result = json.loads(out.split('"Result": ', 1)[1])
        assert result["status"] == "verified", what
    elif words[:2] == ["mneme", "tune"]:
        run = walk.checkout / _option(words, "--results-dir")
        summary = json.loads((run / "summary.json").read_text())
        size = json.loads((run / "search_space.json").read_text())["size"]
        assert summary["complete"] and summary["trials"] == size and summary["verified"] >= 1, summary
        assert json.loads((run / "baseline.json").read_text())["verified"]
        assert (run / "best.json").is_file() and (run / "trials.jsonl").is_file()


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory) -> Walkthrough:
    tmp = tmp_path_factory.mktemp("readme")
    checkout = tmp / "mneme-checkout"
    shutil.copytree(REPO, checkout, ignore=not_in_a_checkout, symlinks=True)
    assert (checkout / "mneme" / "__init__.py").is_file() and not list((checkout / "mneme").glob("_engine*"))
    env = child_env({"PATH": f"{_bin_dir(tmp)}{os.pathsep}{os.environ.get('PATH', '')}",
                     "MNEME_CACHE_DIR": str(tmp / "cache")})
    walk = Walkthrough(checkout, env)
    for step in walkthrough_steps():
        done = walk.run(step.text)
        walk.ran.append((step, done))
        try:
            if step.variable:
                assert done.returncode == 0 and done.stdout.strip(), f"`{step.text}`: {done.stderr[-2000:]}"
                walk.env[step.variable] = done.stdout.strip()
            else:
                check_step(walk, step, done)
        except AssertionError as exc:
            walk.failure = str(exc)
            break
    return walk


@pytest.mark.timeout(900)
def test_the_readme_walkthrough_runs_verbatim_from_the_checkout(walkthrough):
    for step, done in walkthrough.ran:
        print(f"$ {step.text}  -> {done.returncode}")
    assert not walkthrough.failure, walkthrough.failure
    kinds = {" ".join(step.words[:2]) for step, _ in walkthrough.ran}
    assert {"mneme record", "mneme ls", "mneme replay", "mneme tune"} <= kinds


@pytest.mark.timeout(900)
def test_the_readme_python_example_runs_verbatim(walkthrough):
    assert not walkthrough.failure, f"the walkthrough failed first: {walkthrough.failure}"
    command = python_example()
    done = walkthrough.run(command)
    assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "BEST: " in done.stdout
