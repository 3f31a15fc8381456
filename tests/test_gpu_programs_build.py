"""The CUDA programs the GPU tests record compile with nvcc here, without a GPU, so a syntax error is caught
before a GPU session; and, folder by folder, the Makefile, the sources and the GPU test's expectations name the
same programs.

Folders of tests/gpu/programs/ and the GPU tests that record their programs: corpus/ (the reach corpus,
tests/gpu/test_corpus.py), idempotence/ (kernels that are not idempotent, tests/gpu/test_non_idempotent.py),
textures/ (texture and surface objects, tests/gpu/test_textures.py). This module sits outside tests/gpu/,
whose tests are skipped where no GPU is usable.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

GPU_TESTS = Path(__file__).resolve().parent / "gpu"
PROGRAMS = GPU_TESTS / "programs"

#: folder -> (its list in the Makefile, which is also its make target in lower case; the GPU test; the
#: dict in it whose keys are the programs)
FOLDERS = {
    "corpus": ("CORPUS", "test_corpus.py", "CORPUS"),
    "idempotence": ("IDEMPOTENCE", "test_non_idempotent.py", "NON_IDEMPOTENT"),
    "textures": ("TEXTURES", "test_textures.py", "TEXTURES"),
}


def makefile_list(name: str) -> list[str]:
    text = (PROGRAMS / "Makefile").read_text().replace("\\\n", " ")
    match = re.search(rf"^{name} = (.*)$", text, re.MULTILINE)
    assert match, f"the Makefile has no {name} list"
    return sorted(match.group(1).split())


def expected_programs(test_module: str, name: str) -> list[str]:
    """The keys of the GPU test's dict (read, not imported: it needs the GPU test helpers)."""
    tree = ast.parse((GPU_TESTS / test_module).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == name for t in node.targets):
            return sorted(ast.literal_eval(key) for key in node.value.keys)
    raise AssertionError(f"tests/gpu/{test_module} defines no {name}")


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_the_makefile_the_sources_and_the_expectations_name_the_same_programs(folder):
    listed, test_module, expectations = FOLDERS[folder]
    sources = sorted(p.stem for p in (PROGRAMS / folder).glob("*.cu"))
    assert makefile_list(listed) == sources == expected_programs(test_module, expectations)
    if folder != "corpus":  # documented in recording.md; the others, program by program in their README.md
        readme = (PROGRAMS / folder / "README.md").read_text()
        assert [p for p in sources if f"`{p}.cu`" not in readme] == [], f"programs missing from {folder}/README.md"


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_every_program_compiles(tmp_path, folder):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc (CUDA toolkit) is not on PATH: the programs cannot be compiled here")
    proc = subprocess.run(["make", "-s", "-j2", "-C", str(PROGRAMS), folder, f"OUTDIR={tmp_path}", f"NVCC={nvcc}"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == makefile_list(FOLDERS[folder][0])
