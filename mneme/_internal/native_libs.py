"""Finding the native pieces a recording run needs: the recorder library and CUPTI.

``mneme record`` looks them up before it starts the application, so the lookups use ``os.path``
only (the ``*_file`` functions, returning strings); the ``Path``-returning functions wrap them.
"""

from __future__ import annotations

import os

from mneme.errors import NotAvailableError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

RECORDER_NAME = "libmneme_recorder.so"


def native_library_file(name: str, override_var: str, target: str, env: Mapping[str, str] = os.environ) -> str:
    """A native library of mneme: ``$override_var``, else the copy installed in ``mneme/lib`` (a resolved path).

    A source checkout has no installed copy; building the CMake ``target`` and
    pointing ``override_var`` at it is the way there.
    """
    override = env.get(override_var)
    if override:
        if not os.path.isfile(override):
            raise NotAvailableError(f"{override_var}={override} does not exist; build the {target} target or unset it")
        return os.path.realpath(override)
    import mneme

    candidate = os.path.join(os.path.dirname(os.path.abspath(mneme.__file__)), "lib", name)
    if os.path.isfile(candidate):
        return os.path.realpath(candidate)
    raise NotAvailableError(
        f"{name} is not installed with this mneme (a source checkout?); "
        f"install mneme with pip, or build it (cmake --build BUILD --target {target}) "
        f"and set {override_var} to the built library"
    )


def native_library(name: str, override_var: str, target: str, env: Mapping[str, str] = os.environ) -> Path:
    """:func:`native_library_file` as a ``Path``."""
    from pathlib import Path

    return Path(native_library_file(name, override_var, target, env))


def recorder_library_file(env: Mapping[str, str] = os.environ) -> str:
    """``libmneme_recorder.so``: ``MNEME_RECORDER_LIB``, else the copy installed in ``mneme/lib``."""
    return native_library_file(RECORDER_NAME, "MNEME_RECORDER_LIB", "mneme_recorder", env)


def recorder_library(env: Mapping[str, str] = os.environ) -> Path:
    """:func:`recorder_library_file` as a ``Path``."""
    from pathlib import Path

    return Path(recorder_library_file(env))


def _which(program: str, path: str | None) -> str | None:
    """The first executable ``program`` on ``path`` (``shutil.which`` without importing shutil)."""
    for directory in (path if path is not None else os.environ.get("PATH", os.defpath)).split(os.pathsep):
        candidate = os.path.join(directory or os.curdir, program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def cuda_root_dirs(env: Mapping[str, str] = os.environ) -> list[str]:
    """CUDA toolkit roots, in order: CUDA_HOME, CUDA_PATH, the one holding nvcc on PATH, /usr/local/cuda."""
    roots = [env[v] for v in ("CUDA_HOME", "CUDA_PATH") if env.get(v)]
    nvcc = _which("nvcc", env.get("PATH"))
    if nvcc:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    roots.append("/usr/local/cuda")
    return list(dict.fromkeys(os.path.normpath(r) for r in roots))


def cuda_roots(env: Mapping[str, str] = os.environ) -> list[Path]:
    """:func:`cuda_root_dirs` as ``Path`` s."""
    from pathlib import Path

    return [Path(r) for r in cuda_root_dirs(env)]


def cupti_library_file(env: Mapping[str, str] = os.environ) -> str | None:
    """``libcupti.so``: ``MNEME_CUPTI_PATH``, else the first CUDA root that has one (None: let the recorder search)."""
    override = env.get("MNEME_CUPTI_PATH")
    if override:
        return override
    for root in cuda_root_dirs(env):
        for sub in ("lib64", "extras/CUPTI/lib64", "lib"):
            candidate = os.path.join(root, sub, "libcupti.so")
            if os.path.exists(candidate):
                return candidate
    return None


def cupti_library(env: Mapping[str, str] = os.environ) -> Path | None:
    """:func:`cupti_library_file` as a ``Path``."""
    from pathlib import Path

    found = cupti_library_file(env)
    return None if found is None else Path(found)
