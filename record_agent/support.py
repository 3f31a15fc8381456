"""Which recorded launches can be replayed: the policy over what the recorder reports it did not capture.

The recorder snapshots device memory served from its window (and the module
globals); it also reports memory it saw but does not capture (pinned host
memory mapped into the device's address space, memory opened from another
process over IPC). A launch that can reach any of it would replay against
memory that is not there (a CUDA fault) or not the recorded state (a
meaningless verdict), so it is written with ``supported: false`` and the
reasons here, and replay refuses it. So is a launch with a launch attribute
the replay cannot repeat (an event or an L2 persisting window of the
application's process, a graph-only attribute: ``mneme.replay.launch_attrs``),
so that ``mneme ls`` counts it at record time, and one that reaches texture or
surface objects the recorder could not capture (``record_agent.textures`` says
which objects a launch reaches and why one is not captured).
"""

from __future__ import annotations

from typing import Iterable

from mneme.format.database import POINTER_SIZE, LaunchAttribute
from mneme.replay.launch_attrs import unreplayable_reasons
from record_agent.spool import ForeignRange, SpoolEntry

#: What each kind of uncaptured memory is, in the words of the CUDA runtime API.
FOREIGN_KINDS = {
    "host": "pinned host memory mapped into the device (cudaHostAlloc/cudaMallocHost/cudaHostRegister)",
    "ipc": "memory of another process (cudaIpcOpenMemHandle)",
}

def _describe(r: ForeignRange) -> str:
    return f"{FOREIGN_KINDS.get(r.kind, r.kind + ' memory')}, {r.size} bytes at {r.base:#x}"


def _containing(ranges: tuple[ForeignRange, ...], value: int) -> ForeignRange | None:
    for r in ranges:
        if r.base <= value < r.base + max(r.size, 1):
            return r
    return None


def param_name(entry: SpoolEntry, offset: int) -> str:
    for i, (off, size) in enumerate(zip(entry.param_offsets, entry.param_sizes)):
        if off <= offset < off + size:
            return f"argument {i}" + (f" (byte {offset - off} of it)" if offset != off else "")
    return f"the argument word at byte {offset}"


def unsupported_reasons(
    entry: SpoolEntry, attributes: Iterable[LaunchAttribute] = (), textures: Iterable[str] = ()
) -> tuple[str, ...]:
    """Why ``entry`` (launched with ``attributes``) cannot be replayed faithfully; empty when it can.

    ``textures``: the reasons its texture and surface objects give (``record_agent.textures.TexturePlan``).
    """
    reasons: list[str] = list(unreplayable_reasons(attributes))
    ranges = entry.foreign_memory
    if ranges:
        for off in range(0, len(entry.args) - POINTER_SIZE + 1, POINTER_SIZE):
            value = int.from_bytes(entry.args[off : off + POINTER_SIZE], "little")
            r = _containing(ranges, value) if value else None
            if r is not None:
                reasons.append(f"{param_name(entry, off)} points into {_describe(r)}, which is not captured")
        for ref in entry.foreign_references:
            r = _containing(ranges, ref.target)
            if r is not None:
                reasons.append(
                    f"memory the kernel reaches (the buffer at {ref.region:#x}) holds a pointer into "
                    f"{_describe(r)}, which is not captured"
                )
    reasons += textures
    return tuple(dict.fromkeys(reasons))
