"""The CUDA driver version of this machine, recorded by ``mneme tune`` so that ``mneme run --apply``
can refuse tuned code on another driver."""

from __future__ import annotations

import ctypes


def driver_version() -> int | None:
    """``cuDriverGetVersion`` (e.g. 13000), or None without a driver. Needs no GPU context."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return version.value
