"""Finding the native pieces a recording run needs: the recorder library and CUPTI."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Mapping

from mneme.errors import NotAvailableError

RECORDER_NAME = "libmneme_recorder.so"


def native_library(name: str, override_var: str, target: str, env: Mapping[str, str] = os.environ) -> Path:
    """A native library of mneme: ``$override_var``, else the copy installed in ``mneme/lib``.

    A source checkout has no installed copy; building the CMake ``target`` and
    pointing ``override_var`` at it is the way there.
    """
    override = env.get(override_var)
    if override:
        path = Path(override)
        if not path.is_file():
            raise NotAvailableError(f"{override_var}={override} does not exist; build the {target} target or unset it")
        return path.resolve()
    import mneme

    candidate = Path(mneme.__file__).parent / "lib" / name
    if candidate.is_file():
        return candidate.resolve()
    raise NotAvailableError(
        f"{name} is not installed with this mneme (a source checkout?); "
        f"install mneme with pip, or build it (cmake --build BUILD --target {target}) "
        f"and set {override_var} to the built library"
    )


def recorder_library(env: Mapping[str, str] = os.environ) -> Path:
    """``libmneme_recorder.so``: ``MNEME_RECORDER_LIB``, else the copy installed in ``mneme/lib``."""
    return native_library(RECORDER_NAME, "MNEME_RECORDER_LIB", "mneme_recorder", env)


def cuda_roots(env: Mapping[str, str] = os.environ) -> list[Path]:
    """CUDA toolkit roots, in order: CUDA_HOME, CUDA_PATH, the one holding nvcc on PATH, /usr/local/cuda."""
    roots = [Path(env[v]) for v in ("CUDA_HOME", "CUDA_PATH") if env.get(v)]
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    if nvcc:
        roots.append(Path(nvcc).resolve().parent.parent)
    roots.append(Path("/usr/local/cuda"))
    seen, unique = set(), []
    for r in roots:
        if r not in seen:
            seen.add(r)
            unique.append(r)
    return unique


def cupti_library(env: Mapping[str, str] = os.environ) -> Path | None:
    """``libcupti.so``: ``MNEME_CUPTI_PATH``, else the first CUDA root that has one (None: let the recorder search)."""
    override = env.get("MNEME_CUPTI_PATH")
    if override:
        return Path(override)
    for root in cuda_roots(env):
        for sub in ("lib64", "extras/CUPTI/lib64", "lib"):
            candidate = root / sub / "libcupti.so"
            if candidate.exists():
                return candidate
    return None
