"""The reach corpus (tests/gpu/programs/corpus) compiles with nvcc here, without a GPU, so a syntax error
is caught before a GPU session; and the Makefile, the sources and the GPU test's expectations name the
same programs. Running them under `mneme record` and replaying them: tests/gpu/test_corpus.py."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

GPU_TESTS = Path(__file__).resolve().parents[1] / "gpu"
PROGRAMS = GPU_TESTS / "programs"


def makefile_corpus() -> list[str]:
    text = (PROGRAMS / "Makefile").read_text().replace("\\\n", " ")
    match = re.search(r"^CORPUS = (.*)$", text, re.MULTILINE)
    assert match, "the Makefile has no CORPUS list"
    return sorted(match.group(1).split())


def expected_programs() -> list[str]:
    """The keys of tests/gpu/test_corpus.py's CORPUS (read, not imported: it needs the GPU test helpers)."""
    tree = ast.parse((GPU_TESTS / "test_corpus.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "CORPUS" for t in node.targets):
            return sorted(ast.literal_eval(key) for key in node.value.keys)
    raise AssertionError("tests/gpu/test_corpus.py defines no CORPUS")


def test_the_makefile_the_sources_and_the_expectations_name_the_same_programs():
    sources = sorted(p.stem for p in (PROGRAMS / "corpus").glob("*.cu"))
    assert makefile_corpus() == sources == expected_programs()


def test_every_corpus_program_compiles(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc (CUDA toolkit) is not on PATH: the corpus cannot be compiled here")
    proc = subprocess.run(["make", "-s", "-j2", "-C", str(PROGRAMS), "corpus", f"OUTDIR={tmp_path}", f"NVCC={nvcc}"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == makefile_corpus()
