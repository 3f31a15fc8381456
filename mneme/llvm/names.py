"""Match kernel names across compilers: nvcc and clang mangle anonymous namespaces differently.

A kernel in an anonymous namespace is ``_ZN12_GLOBAL__N_18spmv_csrE...`` for
clang but ``_ZN33_GLOBAL__N__ba903b16_5_cg_cu_main8spmv_csrE...`` for nvcc (a
per-file unique name). The launch the recorder sees carries nvcc's name and
the embedded bitcode clang's, so lookups compare names with every
anonymous-namespace component reduced to clang's form. Standard library only.
"""

from __future__ import annotations

import re

_ANON_START = re.compile(r"(\d+)_GLOBAL__N_")
CANONICAL_ANON = "12_GLOBAL__N_1"


def canonical_name(mangled: str) -> str:
    """``mangled`` with each anonymous-namespace source name replaced by ``12_GLOBAL__N_1``."""
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
    """nvcc's anonymous-namespace component names the source file (``5_cg_cu`` for cg.cu); '' if none."""
    match = re.search(r"_GLOBAL__N__[0-9a-f]+_(\d+)_", mangled)
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
