"""Finding the native pieces a recording run needs: the recorder library and CUPTI."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Mapping

from mneme.errors import NotAvailableError

RECORDER_NAME = "libmneme_recorder.so"


def recorder_library(env: Mapping[str, str] = os.environ) -> Path:
    """``libmneme_recorder.so``: ``MNEME_RECORDER_LIB``, else the copy installed in ``mneme/lib``.

    A source checkout has no installed copy; building the ``mneme_recorder``
    CMake target and pointing ``MNEME_RECORDER_LIB`` at it is the way there.
    """
    override = env.get("MNEME_RECORDER_LIB")
    if override:
        path = Path(override)
        if not path.is_file():
            raise NotAvailableError(f"MNEME_RECORDER_LIB={override} does not exist; build the mneme_recorder target or unset it")
        return path.resolve()
    import mneme

    for root in (Path(mneme.__file__).parent / "lib",):
        candidate = root / RECORDER_NAME
        if candidate.is_file():
            return candidate.resolve()
    raise NotAvailableError(
        f"{RECORDER_NAME} is not installed with this mneme (a source checkout?); "
        "install mneme with pip, or build it (cmake --build BUILD --target mneme_recorder) "
        "and set MNEME_RECORDER_LIB to the built library"
    )


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
