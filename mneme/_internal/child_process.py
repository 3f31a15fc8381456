"""Command lines and environments of mneme's own Python child processes (local servers and what they start).

A child must import the same mneme as its parent, whatever the current
directory. ``python -m mneme`` from a checkout would put the checkout's
source tree (without the native parts) first on ``sys.path`` and shadow the
installed package, so children run with a safe path: Python's ``-P`` (no
current directory on ``sys.path``; Python 3.11+) or, on Python 3.10, a
bootstrap that drops that entry before anything is imported. The directory
the parent's mneme came from leads ``PYTHONPATH`` unless it is a site
directory (there the child finds it anyway), so a parent running from a
source tree (``PYTHONPATH=$PWD``, tests) has children that run the same tree.

The workers and compile processes a server starts are ``multiprocessing``
``spawn`` children of a server started this way: they get the server's
``sys.path`` and interpreter flags (``-P`` included) from ``multiprocessing``.
"""

from __future__ import annotations

import os
import site
import sys
from pathlib import Path
from typing import Mapping

#: Where this process imported mneme from (the directory holding the ``mneme`` package).
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])

# Python 3.10 has no -P: drop the current directory (sys.path[0] of -c) before running the module.
_SAFE_BOOTSTRAP = "import runpy, sys; del sys.path[0]; runpy.run_module(sys.argv[1], run_name='__main__', alter_sys=True)"


def python_command(module: str, *args: str) -> list[str]:
    """``python -m module args...`` with a safe path: the current directory is not on the child's sys.path."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module, *args]
    return [sys.executable, "-c", _SAFE_BOOTSTRAP, module, *args]


def mneme_command(*args: str) -> list[str]:
    """The ``mneme`` command line (``mneme serve ...``) as a child of this process runs it."""
    return python_command("mneme", *args)


def _site_directories() -> set[str]:
    dirs = set(getattr(site, "getsitepackages", lambda: [])())
    user = getattr(site, "getusersitepackages", lambda: None)()
    if user:
        dirs.add(user)
    return {str(Path(d).resolve()) for d in dirs}


def child_env(extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child: ``base`` (default: ours) updated by ``extra``, with the directory our
    mneme came from leading ``PYTHONPATH`` (unless it is a site directory)."""
    env = {**(os.environ if base is None else base), **(extra or {})}
    if PACKAGE_ROOT not in _site_directories():
        rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != PACKAGE_ROOT]
        env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT, *rest])
    return env
