"""The PTX of a kernel recorded from a Triton program, found in Triton's cache.

Triton loads its kernels as cubins (``cuModuleLoadData``), so the recorded
module carries no PTX; Triton's cache keeps each kernel's PTX beside its cubin
(``<cache>/<key>/<kernel>.ptx`` next to ``<kernel>.cubin``). The PTX whose
cubin is byte for byte the recorded one is the kernel's code (or, where none
is, the only PTX the cache has for that kernel name), and the PTX tier
(codegen levels, launch bounds, specialization) then applies to it.
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


def find_ptx(cubins: tuple[bytes, ...], kernel: str, env: Mapping[str, str]) -> str | None:
    """The cached PTX of ``kernel`` whose cubin is one of ``cubins`` (the image the program loaded, the
    cubin as the driver reported it); else the PTX of the only cached ``kernel``; None when there is none."""
    cubins = tuple(c for c in cubins if c and c.startswith(b"\x7fELF"))
    if not cubins:
        return None
    only: list[str] = []
    for root in cache_dirs(env):
        try:
            candidates = list(root.glob(f"*/{kernel}.cubin"))
        except OSError:
            continue
        for path in candidates:
            try:
                ptx = path.with_suffix(".ptx").read_text(errors="replace")
                if not ptx_defines(ptx, kernel):
                    continue
                if path.read_bytes() in cubins:
                    return ptx
            except OSError:
                continue
            only.append(ptx)
    return only[0] if len(only) == 1 else None
