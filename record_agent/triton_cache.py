"""The PTX of a kernel recorded from a Triton program, found in Triton's cache.

Triton loads its kernels as cubins (``cuModuleLoadData``), so the recorded
module carries no PTX; Triton's cache keeps each kernel's PTX beside its cubin
(``<cache>/<key>/<kernel>.ptx`` next to ``<kernel>.cubin``). The PTX whose
cubin is byte for byte the recorded one is the kernel's code, and the PTX
tier (codegen levels, launch bounds, specialization) then applies to it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from record_agent.fatbin import ptx_defines


def cache_dirs(env: Mapping[str, str]) -> list[Path]:
    """Where Triton caches compiled kernels: ``$TRITON_CACHE_DIR``, else ``~/.triton/cache``."""
    if env.get("TRITON_CACHE_DIR"):
        return [Path(env["TRITON_CACHE_DIR"])]
    home = env.get("HOME") or os.path.expanduser("~")
    return [Path(home) / ".triton" / "cache"]


def find_ptx(cubin: bytes, kernel: str, env: Mapping[str, str]) -> str | None:
    """The cached PTX of ``kernel`` whose cubin is ``cubin``; None when the cache has none."""
    if not cubin.startswith(b"\x7fELF"):
        return None
    for root in cache_dirs(env):
        try:
            candidates = list(root.glob(f"*/{kernel}.cubin"))
        except OSError:
            continue
        for path in candidates:
            ptx_path = path.with_suffix(".ptx")
            try:
                if path.stat().st_size != len(cubin) or path.read_bytes() != cubin:
                    continue
                ptx = ptx_path.read_text(errors="replace")
            except OSError:
                continue
            if ptx_defines(ptx, kernel):
                return ptx
    return None
