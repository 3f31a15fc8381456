"""Block-shape candidates that keep a kernel's work covered.

A recorded launch covers ``grid * block`` threads per axis. A candidate block
shape keeps that total and recomputes the grid as ``ceil(total / block)``, so
every element the application's launch touched is still touched (kernels
guard the tail with ``if (i < n)``, as the recorded one does when its total is
not a multiple of the block).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from mneme.errors import ConfigurationError
from mneme.model.experiment import (
    MAX_BLOCK_DIM,
    MAX_GRID_DIM,
    MAX_THREADS_PER_BLOCK,
    Dim3,
)

LAUNCH_DIMS = ("none", "auto", "x", "xy", "xyz")
LAUNCH_SAFETIES = ("conservative", "balanced", "aggressive")
# Factors applied to the recorded extent of an axis.
SCALE_FACTORS = (0.5, 0.75, 1.25, 1.5, 2.0)


@dataclass(frozen=True)
class RecordedLaunch:
    """The launch shape of the recorded instance."""

    grid: Dim3
    block: Dim3
    shared_mem: int = 0

    @property
    def total(self) -> Dim3:
        """Threads per axis the recorded launch covers."""
        return Dim3(*(g * b for g, b in zip(self.grid.as_tuple(), self.block.as_tuple())))


def shape_key(block: Dim3) -> str:
    """The ``block_shape`` parameter value: ``"XxYxZ"``."""
    return f"{block.x}x{block.y}x{block.z}"


def parse_shape_key(key: str) -> Dim3:
    try:
        x, y, z = (int(p) for p in key.split("x"))
    except ValueError:
        raise ConfigurationError(f"block shape {key!r} is not of the form XxYxZ, e.g. 256x1x1") from None
    return Dim3(x, y, z)


def covering_grid(total: Dim3, block: Dim3) -> Dim3:
    """The grid that covers ``total`` threads per axis with ``block``."""
    return Dim3(*(-(-t // b) for t, b in zip(total.as_tuple(), block.as_tuple())))


def tuned_axes(launch_dim: str, recorded: RecordedLaunch) -> tuple[int, ...]:
    """Axis indices ``--launch-dim`` lets vary; ``auto`` = the axes with more than one thread."""
    if launch_dim not in LAUNCH_DIMS:
        raise ConfigurationError(f"--launch-dim {launch_dim!r}: choose one of {', '.join(LAUNCH_DIMS)}")
    if launch_dim == "none":
        return ()
    if launch_dim == "auto":
        return tuple(i for i, t in enumerate(recorded.total.as_tuple()) if t > 1)
    return tuple("xyz".index(a) for a in launch_dim)


def thread_limit(launch_safety: str, recorded: RecordedLaunch) -> int:
    """Most threads per block a candidate may have under ``--launch-safety``."""
    recorded_threads = recorded.block.count
    if launch_safety == "conservative":
        return recorded_threads
    if launch_safety == "balanced":
        return min(2 * recorded_threads, MAX_THREADS_PER_BLOCK)
    if launch_safety == "aggressive":
        return MAX_THREADS_PER_BLOCK
    raise ConfigurationError(
        f"--launch-safety {launch_safety!r}: choose one of {', '.join(LAUNCH_SAFETIES)}"
    )


def _divisors_up_to(n: int, limit: int) -> Iterable[int]:
    d = 1
    while d * d <= n:
        if n % d == 0:
            if d <= limit:
                yield d
            if n // d <= limit:
                yield n // d
        d += 1


def axis_candidates(recorded_block: int, total: int, axis: int, limit: int) -> list[int]:
    """Candidate block extents for one axis, sorted.

    The recorded value, powers of two, the recorded value scaled by 0.5, 0.75,
    1.25, 1.5 and 2, and divisors of the axis's work; none above the axis's
    CUDA limit, ``limit`` threads, or the work itself (a larger block would
    only add idle threads), except the recorded value, which is always kept.
    """
    cap = min(MAX_BLOCK_DIM[axis], limit, max(total, 1))
    values = {recorded_block}
    p = 1
    while p <= cap:
        values.add(p)
        p *= 2
    values.update(int(round(recorded_block * f)) for f in SCALE_FACTORS)
    if total <= 1 << 40:  # divisor search is O(sqrt(total))
        values.update(_divisors_up_to(total, cap))
    return sorted(v for v in values if 1 <= v and (v <= cap or v == recorded_block))


def block_shapes(recorded: RecordedLaunch, launch_dim: str, launch_safety: str,
                 code_max_threads: int | None = None) -> list[Dim3]:
    """Every candidate block shape: the recorded one first, then by thread count and axes.
    ``code_max_threads``: the most threads per block the kernel's code accepts (``.maxntid``)."""
    axes = tuned_axes(launch_dim, recorded)
    limit = thread_limit(launch_safety, recorded)
    if code_max_threads is not None:
        limit = min(limit, code_max_threads)
    per_axis: list[list[int]] = []
    for axis, (b, t) in enumerate(zip(recorded.block.as_tuple(), recorded.total.as_tuple())):
        per_axis.append(axis_candidates(b, t, axis, limit) if axis in axes else [b])
    shapes = {recorded.block}
    for x in per_axis[0]:
        for y in per_axis[1]:
            for z in per_axis[2]:
                block = Dim3(x, y, z)
                if block.count > limit or z > MAX_BLOCK_DIM[2]:
                    continue
                grid = covering_grid(recorded.total, block)
                if any(g > m for g, m in zip(grid.as_tuple(), MAX_GRID_DIM)):
                    continue
                shapes.add(block)
    others = sorted(shapes - {recorded.block}, key=lambda d: (d.count, d.as_tuple()))
    return [recorded.block, *others]
