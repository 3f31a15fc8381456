"""Match kernel names across compilers: nvcc and clang mangle file-local kernels differently.

A kernel in an anonymous namespace is ``_ZN12_GLOBAL__N_18spmv_csrE...`` for
clang but ``_ZN33_GLOBAL__N__ba903b16_5_cg_cu_main8spmv_csrE...`` for nvcc (a
per-file unique name). A ``static __global__`` kernel keeps the internal-linkage
marker ``L`` in clang's name (``_ZL5scalePf``, ``_ZN2nsL5scaleEPf``) and loses it
in nvcc's (``_Z5scalePf``), which under ``-rdc`` also gets a per-file prefix
(``__nv_static_27__2c130fac_6_st3_cu_d589cb60__Z5scalePf``). The launch the
recorder sees carries nvcc's name and the embedded bitcode clang's, so lookups
compare canonical names: no ``__nv_static_`` prefix, no internal-linkage
marker, every anonymous-namespace component in clang's form. Standard library
only.
"""

from __future__ import annotations

import re

_ANON_START = re.compile(r"(\d+)_GLOBAL__N_")
_NV_STATIC = re.compile(r"__nv_static_(\d+)_")
_LENGTH = re.compile(r"\d+")
CANONICAL_ANON = "12_GLOBAL__N_1"


def _strip_nv_static(mangled: str) -> str:
    """nvcc's -rdc name of a static kernel, ``__nv_static_<n>_<n chars>_<mangled name>``, less its prefix."""
    match = _NV_STATIC.match(mangled)
    if match:
        rest = mangled[match.end() + int(match.group(1)) :]
        if rest.startswith("__Z"):
            return rest[1:]
    return mangled


def _drop_internal_marker(mangled: str) -> str:
    """``_ZL5scale...`` -> ``_Z5scale...``; ``_ZN2nsL5scaleE...`` -> ``_ZN2ns5scaleE...``."""
    if mangled.startswith("_ZL") and mangled[3:4].isdigit():
        return "_Z" + mangled[3:]
    if not mangled.startswith("_ZN"):
        return mangled
    out, pos = ["_ZN"], 3
    while pos < len(mangled):  # the nested name's <source-name>s, each optionally after an L
        if mangled[pos] == "L" and mangled[pos + 1 : pos + 2].isdigit():
            pos += 1
        match = _LENGTH.match(mangled, pos)
        if not match:
            break
        end = match.end() + int(match.group())
        out.append(mangled[pos:end])
        pos = end
    return "".join(out) + mangled[pos:]


def canonical_name(mangled: str) -> str:
    """``mangled`` without nvcc's static prefix or clang's internal-linkage marker, and with each
    anonymous-namespace source name replaced by ``12_GLOBAL__N_1``."""
    mangled = _drop_internal_marker(_strip_nv_static(mangled))
    out, pos = [], 0
    for match in _ANON_START.finditer(mangled):
        if match.start() < pos:
            continue
        length = int(match.group(1))
        start = match.start(1) + len(match.group(1))
        if start + length > len(mangled):
            continue
        out.append(mangled[pos : match.start()])
        out.append(CANONICAL_ANON)
        pos = start + length
    out.append(mangled[pos:])
    return "".join(out)


def file_hint(mangled: str) -> str:
    """nvcc's anonymous-namespace component or -rdc static prefix names the source file (``5_cg_cu``
    for cg.cu); '' if none."""
    match = re.search(r"(?:_GLOBAL__N__|^__nv_static_\d+__)[0-9a-f]+_(\d+)_", mangled)
    if not match:
        return ""
    return mangled[match.end() : match.end() + int(match.group(1))]


def same_kernel(recorded: str, embedded: str) -> bool:
    return recorded == embedded or canonical_name(recorded) == canonical_name(embedded)


def pick(recorded: str, candidates: list[str], sources: list[str] | None = None) -> int | None:
    """Index of the candidate that is ``recorded`` (exactly, else up to anonymous namespaces);
    when several match, the one whose source file the nvcc name points at."""
    if recorded in candidates:
        return candidates.index(recorded)
    matches = [i for i, c in enumerate(candidates) if same_kernel(recorded, c)]
    if len(matches) > 1 and sources:
        hint = file_hint(recorded)
        preferred = [i for i in matches if hint and sources[i].rsplit("/", 1)[-1].replace(".", "_") == hint]
        matches = preferred or matches
    return matches[0] if matches else None
