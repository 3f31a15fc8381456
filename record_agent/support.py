"""Which recorded launches can be replayed: the policy over what the recorder reports it did not capture.

The recorder snapshots device memory served from its window (and the module
globals); it also reports memory it saw but does not capture (managed, pinned
host memory mapped into the device's address space, memory opened from another
process over IPC) and the texture and surface objects alive at the launch. A
launch that can reach any of it would replay against memory that is not there
(a CUDA fault) or not the recorded state (a meaningless verdict), so it is
written with ``supported: false`` and the reasons here, and replay refuses it.
So is a launch with a launch attribute the replay cannot repeat (an event or an
L2 persisting window of the application's process, a graph-only attribute:
``mneme.replay.launch_attrs``), so that ``mneme ls`` counts it at record time.
"""

from __future__ import annotations

import re
from typing import Iterable

from mneme.format.database import POINTER_SIZE, LaunchAttribute
from mneme.replay.launch_attrs import unreplayable_reasons
from record_agent.spool import ForeignRange, SpoolEntry

#: What each kind of uncaptured memory is, in the words of the CUDA runtime API.
FOREIGN_KINDS = {
    "host": "pinned host memory mapped into the device (cudaHostAlloc/cudaMallocHost/cudaHostRegister)",
    "ipc": "memory of another process (cudaIpcOpenMemHandle)",
}

# PTX instructions that read texture or surface objects.
_TEXTURE_PTX = re.compile(r"^\s*(?:@!?%\w+\s+)?(?:tex|tld4|txq)\.", re.MULTILINE)
_SURFACE_PTX = re.compile(r"^\s*(?:@!?%\w+\s+)?(?:suld|sust|sured|suq)\.", re.MULTILINE)


_DEFINITION = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+|\.extern\s+)*\.(entry|func)\b[^\n]*?([\w$.]+)\s*\(",
                         re.MULTILINE)


def kernel_ptx(ptx: str, kernel: str) -> str:
    """The part of a module's PTX the kernel can run: its own ``.entry`` and every ``.func`` (any may be called)."""
    starts = list(_DEFINITION.finditer(ptx))
    if not starts:
        return ptx
    parts = []
    for k, m in enumerate(starts):
        end = starts[k + 1].start() if k + 1 < len(starts) else len(ptx)
        if m.group(1) == "func" or m.group(2) == kernel:
            parts.append(ptx[m.start() : end])
    return "".join(parts)


def _describe(r: ForeignRange) -> str:
    return f"{FOREIGN_KINDS.get(r.kind, r.kind + ' memory')}, {r.size} bytes at {r.base:#x}"


def _containing(ranges: tuple[ForeignRange, ...], value: int) -> ForeignRange | None:
    for r in ranges:
        if r.base <= value < r.base + max(r.size, 1):
            return r
    return None


def _param_index(entry: SpoolEntry, offset: int) -> str:
    for i, (off, size) in enumerate(zip(entry.param_offsets, entry.param_sizes)):
        if off <= offset < off + size:
            return f"argument {i}" + (f" (byte {offset - off} of it)" if offset != off else "")
    return f"the argument word at byte {offset}"


def _object_reasons(entry: SpoolEntry, handles: tuple[int, ...], what: str, uses: bool | None) -> list[str]:
    """Reasons for texture or surface objects: ``uses`` says whether the kernel's PTX reads them (None: no PTX)."""
    if not handles or uses is False:
        return []
    if uses:
        return [f"the kernel reads {what} objects ({len(handles)} alive at the launch): {what} state is not captured"]
    live = set(handles)
    found = []
    for i, (off, size) in enumerate(zip(entry.param_offsets, entry.param_sizes)):
        if size == POINTER_SIZE and int.from_bytes(entry.args[off : off + size], "little") in live:
            found.append(f"argument {i} is a {what} object: {what} state is not captured")
    return found


def unsupported_reasons(entry: SpoolEntry, ptx: str | None, attributes: Iterable[LaunchAttribute] = ()) -> tuple[str, ...]:
    """Why ``entry`` (launched with ``attributes``) cannot be replayed faithfully; empty when it can."""
    reasons: list[str] = list(unreplayable_reasons(attributes))
    ranges = entry.foreign_memory
    if ranges:
        for off in range(0, len(entry.args) - POINTER_SIZE + 1, POINTER_SIZE):
            value = int.from_bytes(entry.args[off : off + POINTER_SIZE], "little")
            r = _containing(ranges, value) if value else None
            if r is not None:
                reasons.append(f"{_param_index(entry, off)} points into {_describe(r)}, which is not captured")
        for ref in entry.foreign_references:
            r = _containing(ranges, ref.target)
            if r is not None:
                reasons.append(
                    f"memory the kernel reaches (the buffer at {ref.region:#x}) holds a pointer into "
                    f"{_describe(r)}, which is not captured"
                )
    code = kernel_ptx(ptx, entry.kernel) if ptx else None
    reasons += _object_reasons(entry, entry.texture_objects, "texture", bool(_TEXTURE_PTX.search(code)) if code else None)
    reasons += _object_reasons(entry, entry.surface_objects, "surface", bool(_SURFACE_PTX.search(code)) if code else None)
    return tuple(dict.fromkeys(reasons))
