"""Placing recorded heap buffers at their recorded addresses: reservations kept for the process's life.

A replay restores the heap where the recording had it, so that every pointer
the kernel finds in memory is valid as recorded. That needs the recorded
device addresses reserved (``cuMemAddressReserve`` at exactly that base) in
the replay process. Three facts shape how:

* the driver refuses to reserve again a range it has freed, and takes large
  ranges for its own allocations: so a range reserved here is never freed;
  replays map physical pages into it and unmap them when they close (a
  server worker replays instance after instance in one process);
* recordings have different bases (the recorder's default, its fallbacks,
  recordings made by older versions at ``0x7f0000000000``, relocatable ones
  at driver addresses): so reservations are made where each recording's
  regions are, for the extent they span, not at one fixed window;
* a recording's regions can lie far apart (a relocatable recording spans
  terabytes): so the pages they touch are grouped into clusters, and each
  cluster is reserved on its own instead of one huge lo..hi span.

When a range cannot be had, ``Unplaceable`` says why: the driver's error, and
what ``/proc/self/maps`` shows in the range (a shared library, the driver's
own mapping, another replay's lease). The caller then relocates, reporting
that reason, or refuses (``--no-relocate``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Iterable

from mneme.replay.address_map import describe_taken, zones_overlapping

MIB = 1 << 20
#: Touched pages closer than this share one reservation (the gap costs address space only).
CLUSTER_GAP = 64 * MIB
#: A new reservation is first tried rounded out to this alignment, so the next instances of a
#: recording, whose regions are near, usually find their pages reserved already.
RESERVATION_ALIGN = 64 * MIB


#: What a process reserves at the recorder's default base when it opens its first context: the
#: default windows of the first 16 devices (4 GiB each), else fewer.
GUARD_SIZES = tuple(gib << 30 for gib in (64, 16, 4))


class Unplaceable(Exception):
    """The recorded addresses cannot be had in this process; ``str()`` says why."""


@dataclass
class HeldRange:
    """One reservation of this process, ``[start, end)``, and the spans replays have leased in it."""

    reservation: Any  # engine Reservation: base, size, map(offset, size, device), unmap(offset, size)
    busy: list[tuple[int, int]] = field(default_factory=list)  # absolute [start, end) spans

    @property
    def start(self) -> int:
        return int(self.reservation.base)

    @property
    def end(self) -> int:
        return int(self.reservation.base) + int(self.reservation.size)

    def busy_in(self, start: int, end: int) -> tuple[int, int] | None:
        return next(((s, e) for s, e in self.busy if s < end and start < e), None)


@dataclass
class Lease:
    """Pages mapped at recorded addresses for one replay; ``release`` unmaps them (the reservations stay)."""

    pieces: list[tuple[HeldRange, int, int]]  # (range, start, end), absolute

    @property
    def mapped_bytes(self) -> int:
        return sum(end - start for _, start, end in self.pieces)

    def release(self) -> None:
        for held, start, end in self.pieces:
            held.reservation.unmap(start - held.start, end - start)
            held.busy.remove((start, end))
        self.pieces = []


def _align_down(value: int, align: int) -> int:
    return value // align * align


def _align_up(value: int, align: int) -> int:
    return -(-value // align) * align


def clusters(spans: Iterable[tuple[int, int]], max_gap: int = CLUSTER_GAP, barriers: Iterable[int] = ()) -> list[tuple[int, int]]:
    """``[start, end)`` spans, sorted and merged wherever the gap between neighbours is at most ``max_gap``
    and holds none of the ``barriers`` (addresses a merged span must not cover)."""
    walls = sorted(barriers)
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start - out[-1][1] <= max_gap:
            i = bisect.bisect_left(walls, out[-1][1])
            if i == len(walls) or walls[i] >= start:
                out[-1] = (out[-1][0], max(out[-1][1], end))
                continue
        out.append((start, end))
    return out


class ProcessReservations:
    """Every range this process reserved at recorded addresses (sorted, disjoint, never freed)."""

    def __init__(self) -> None:
        self.held: list[HeldRange] = []

    def lease(self, ctx: Any, ranges: Iterable[tuple[int, int]], device: int) -> Lease:
        """Map the pages that the (address, size) ``ranges`` touch at their own addresses, on ``device``.

        Pages inside ranges held already are leased there; the others are reserved,
        cluster by cluster. Unplaceable when a page is leased by another replay of
        this process, or a cluster cannot be reserved at its address.
        """
        granularity = int(ctx.allocation_granularity())
        pages = [(offset, offset + size) for offset, size in pages_covering(ranges, 0, granularity)]
        pieces, missing = self._split(pages)
        for held, start, end in pieces:
            taken = held.busy_in(start, end)
            if taken is not None:
                raise Unplaceable(
                    f"{taken[0]:#x}-{taken[1]:#x} is in use by another replay in this process (a replay server's "
                    "worker keeps the instances it prepared restored)"
                )
        for start, end in clusters(missing, barriers=[h.start for h in self.held]):
            self._reserve(ctx, start, end, granularity)
        if missing:
            pieces, _ = self._split(pages)
        done: list[tuple[HeldRange, int, int]] = []
        try:
            for held, start, end in pieces:
                held.reservation.map(start - held.start, end - start, device)
                held.busy.append((start, end))
                done.append((held, start, end))
        except Exception as exc:
            Lease(done).release()
            raise Unplaceable(f"mapping device memory at the recorded addresses failed: {_message(exc)}") from exc
        return Lease(done)

    def guard(self, ctx: Any, base: int, sizes: Iterable[int] = GUARD_SIZES) -> int:
        """Reserve ``[base, base + size)`` for the first of ``sizes`` the driver grants at ``base``, held for
        replays to lease from; the size held (0: none, and replays reserve what they need when they need it).

        A process does this when it opens its first context: the driver takes address ranges for itself at
        its first allocations (a server worker's self-test, staging buffers), and one of those could take
        the range recordings are made at before any replay asks for it.
        """
        for size in sizes:
            if any(h.start < base + size and base < h.end for h in self.held):
                continue
            try:
                reservation = ctx.reserve(base, size)
            except Exception:  # taken (partly): try a smaller one
                continue
            bisect.insort(self.held, HeldRange(reservation), key=lambda h: h.start)
            return size
        return 0

    # -- internals -----------------------------------------------------------------------
    def _split(self, pages: list[tuple[int, int]]) -> tuple[list[tuple[HeldRange, int, int]], list[tuple[int, int]]]:
        """The parts of ``pages`` inside held ranges (per range), and the parts outside every one."""
        pieces, missing = [], []
        for start, end in pages:
            cursor = start
            for held in self.held:
                if held.end <= cursor or held.start >= end:
                    continue
                if cursor < held.start:
                    missing.append((cursor, held.start))
                pieces.append((held, max(cursor, held.start), min(end, held.end)))
                cursor = min(end, held.end)
            if cursor < end:
                missing.append((cursor, end))
        return pieces, missing

    def _room(self, start: int, end: int) -> tuple[int, int]:
        """The widest span around ``[start, end)`` that no held range overlaps."""
        starts = [h.start for h in self.held]
        i = bisect.bisect_left(starts, start)
        lo = self.held[i - 1].end if i > 0 else 0
        hi = self.held[i].start if i < len(self.held) else 1 << 64
        return lo, hi

    def _reserve(self, ctx: Any, start: int, end: int, granularity: int) -> None:
        align = _align_up(RESERVATION_ALIGN, granularity)
        lo, hi = self._room(start, end)
        wide = (max(_align_down(start, align), lo), min(_align_up(end, align), hi))
        error: Exception | None = None
        for base, limit in dict.fromkeys([wide, (start, end)]):
            try:
                reservation = ctx.reserve(base, limit - base)
            except Exception as exc:  # taken (partly): try the exact span, then give up
                error = error or exc
                continue
            held = HeldRange(reservation)
            bisect.insort(self.held, held, key=lambda h: h.start)
            return
        raise Unplaceable(_why_not_reserved(start, end, error))


def _message(error: Exception | None) -> str:
    """An exception's message; the engine's CudaError carries (message, code, name)."""
    if error is not None and len(error.args) > 1 and isinstance(error.args[0], str):
        return error.args[0]
    return str(error)


def _why_not_reserved(start: int, end: int, error: Exception | None) -> str:
    why = f"reserving {start:#x}-{end:#x} ({(end - start) >> 20} MiB) failed: {_message(error)}"
    taken = describe_taken(start, end)
    if taken:
        why += f"; {taken}"
    zones = zones_overlapping(start, end)
    if zones:
        why += (
            f"; the range lies in the {zones[0].name} zone where Linux places a process's own mappings "
            "(recordings of this mneme use 0x200000000000, away from them; re-record to replay at fixed addresses)"
        )
    return why


_process = ProcessReservations()


def process_reservations() -> ProcessReservations:
    """The reservations of this process (one registry: replays of every recording share it)."""
    return _process


def pages_covering(ranges: Iterable[tuple[int, int]], base: int, granularity: int) -> list[tuple[int, int]]:
    """Granularity-aligned (offset, size) spans relative to ``base`` that cover every (address, size) range, merged."""
    spans = []
    for address, size in ranges:
        if size <= 0:
            continue
        lo = (address - base) // granularity * granularity
        hi = -(-(address + size - base) // granularity) * granularity
        spans.append((lo, hi))
    spans.sort()
    merged: list[list[int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi - lo) for lo, hi in merged]
