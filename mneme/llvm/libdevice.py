"""libdevice: the CUDA math library as bitcode, linked when IR still calls ``__nv_*``.

clang links the libdevice functions a translation unit uses into its bitcode
already; this covers IR from other producers and user transformations that
add calls to ``__nv_*`` functions.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from mneme.errors import NotAvailableError

_RELATIVE = Path("nvvm", "libdevice", "libdevice.10.bc")


def libdevice_path() -> Path:
    """``MNEME_LIBDEVICE``, else ``$CUDA_PATH``/``$CUDA_HOME``/``/usr/local/cuda`` + nvvm/libdevice."""
    explicit = os.environ.get("MNEME_LIBDEVICE")
    if explicit:
        return Path(explicit)
    for root in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and (Path(root) / _RELATIVE).exists():
            return Path(root) / _RELATIVE
    raise NotAvailableError(
        "the kernel IR calls CUDA math functions (__nv_*) but libdevice.10.bc was not found; "
        "set CUDA_PATH to the CUDA toolkit or MNEME_LIBDEVICE to the file"
    )


@functools.lru_cache(maxsize=2)
def _libdevice_bytes(path: str) -> bytes:
    return Path(path).read_bytes()


def needs_libdevice(module) -> bool:
    return any(fn.is_declaration and fn.name.startswith("__nv_") for fn in module.functions)


def link_libdevice(module) -> None:
    """Link libdevice into ``module`` and make its functions internal (prune drops the unused ones)."""
    from mneme.llvm._binding import llvm, parse_bitcode

    wanted = {fn.name for fn in module.functions if fn.is_declaration and fn.name.startswith("__nv_")}
    library = parse_bitcode(_libdevice_bytes(str(libdevice_path())))
    library.triple = module.triple
    library.data_layout = module.data_layout
    module.link_in(library)
    binding = llvm()
    for fn in module.functions:
        if fn.name.startswith("__nv_") and not fn.is_declaration:
            fn.linkage = binding.Linkage.internal
    missing = [n for n in wanted if module.get_function(n).is_declaration]
    if missing:
        raise NotAvailableError(f"libdevice does not define {', '.join(sorted(missing))}")
