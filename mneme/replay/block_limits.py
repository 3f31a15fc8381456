"""The block shapes a kernel's recorded code can be launched with.

A kernel's code may fix its block shape: PTX ``.reqntid X, Y, Z`` on the entry
(Triton emits it; nvcc's ``__block_size__((X, Y, Z))`` does too) makes every
launch with another block fail, and ``.maxntid X, Y, Z`` (nvcc
``__launch_bounds__(N)``) fails every launch with more than ``X*Y*Z``
threads. ptxas carries both into the cubin (:mod:`mneme.replay.nv_info`), so a
kernel recorded without PTX (cuBLAS/cuDNN's SASS-only kernels) says the same
there. The tuner uses this to refuse block-shape tuning of a kernel whose shape
is fixed, and to keep the shapes of a bounded one under its bound, instead of
failing every such trial with a launch error (tuner/space/knobs.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from mneme.errors import MnemeError
from mneme.model.experiment import Dim3
from mneme.replay.nv_info import EIATTR_MAX_THREADS, EIATTR_REQNTID, kernel_attributes
from mneme.replay.ptx import find_entry

_THREAD_DIRECTIVE = re.compile(r"\.(reqntid|maxntid)\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")


@dataclass(frozen=True)
class BlockLimit:
    """One constraint of the code on its launch's block: an exact shape (``required``) or a thread cap."""

    required: bool
    dims: tuple[int, int, int]
    source: str  # where it was read: "PTX .reqntid", "cubin EIATTR_MAX_THREADS", ...

    @property
    def threads(self) -> int:
        return math.prod(self.dims)

    def allows(self, block: Dim3) -> bool:
        if self.required:
            return block.as_tuple() == self.dims
        return block.count <= self.threads

    def describe(self) -> str:
        return f"{self.source} {', '.join(str(d) for d in self.dims)}"


@dataclass(frozen=True)
class BlockLimits:
    """Every constraint the recorded code puts on the block shape (none: any shape may launch)."""

    limits: tuple[BlockLimit, ...] = ()
    unread: str = ""  # why the code could not be read ('' when it was, or there was none)

    @property
    def required(self) -> BlockLimit | None:
        """The exact block shape the code demands, if it does."""
        return next((limit for limit in self.limits if limit.required), None)

    @property
    def max_threads(self) -> BlockLimit | None:
        """The tightest thread cap, if any."""
        caps = [limit for limit in self.limits if not limit.required]
        return min(caps, key=lambda limit: limit.threads) if caps else None

    def allows(self, block: Dim3) -> bool:
        return all(limit.allows(block) for limit in self.limits)


def ptx_limits(ptx: str, kernel: str) -> tuple[BlockLimit, ...]:
    """``.reqntid``/``.maxntid`` of ``kernel``'s entry (missing extents are 1)."""
    span = find_entry(ptx, kernel)
    out = []
    for match in _THREAD_DIRECTIVE.finditer(ptx[span.params_end : span.body_start]):
        name, *extents = match.groups()
        dims = tuple(int(e) if e else 1 for e in extents)
        out.append(BlockLimit(name == "reqntid", dims, f"PTX .{name}"))
    return tuple(out)


def cubin_limits(cubin: bytes, kernel: str) -> tuple[BlockLimit, ...]:
    """EIATTR_REQNTID/EIATTR_MAX_THREADS of ``kernel`` in its cubin (none when it has no ``.nv.info``)."""
    out = []
    for attribute in kernel_attributes(cubin, kernel) or ():
        if attribute.code == EIATTR_REQNTID:
            out.append(BlockLimit(True, attribute.dims(), "cubin EIATTR_REQNTID"))
        elif attribute.code == EIATTR_MAX_THREADS:
            out.append(BlockLimit(False, attribute.dims(), "cubin EIATTR_MAX_THREADS"))
    return tuple(out)


def recorded_block_limits(kernel: Any) -> BlockLimits:
    """The limits of a recorded instance's code (``KernelInstance``): its PTX when the recording has
    it (the code the PTX tier compiles, and the source of the cubin), else its cubin. A recording
    whose code cannot be read gives no limits and says why (``unread``); replaying it reports the
    damage itself."""
    code, load = getattr(kernel, "code", None), getattr(kernel, "load_code", None)
    name = getattr(kernel, "kernel_name", "")
    if code is None or load is None or not name:
        return BlockLimits()
    try:
        if getattr(code, "ptx", None) is not None:
            return BlockLimits(ptx_limits(load("ptx").decode("utf-8", "replace"), name))
        if getattr(code, "cubin", None) is not None:
            return BlockLimits(cubin_limits(load("cubin"), name))
    except MnemeError as exc:
        return BlockLimits(unread=str(exc))
    return BlockLimits()
