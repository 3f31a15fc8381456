"""Whether this machine can run GPU tests (importable from any test folder)."""

from __future__ import annotations

import ctypes
import functools


@functools.lru_cache(maxsize=1)
def gpu_unavailable_reason() -> str | None:
    """None when a CUDA driver and at least one GPU are usable, else why not."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no NVIDIA driver on this machine (libcuda.so.1 not found)"
    if cuda.cuInit(0) != 0:
        return "the CUDA driver failed to initialize (cuInit); is a GPU visible?"
    count = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return "no CUDA device visible"
    return None


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child Python that must import the same mneme as this test process.

    Putting the checkout first on PYTHONPATH would shadow an installed mneme (and
    its native parts) with the source tree; this puts the tree mneme was imported
    from first instead (``mneme._internal.child_process.child_env``, as mneme does for its own children).
    """
    from mneme._internal.child_process import child_env as mneme_child_env

    return mneme_child_env(extra)
