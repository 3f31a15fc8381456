"""Where a Linux process has its host mappings, and what holds an address range in this one.

A device address a replay wants at its recorded value must be free in the
replay process's host address space too: with unified addressing the CUDA
driver reserves every device range in the host's (an ``mmap`` of the range),
so a shared library, a Python arena or one of the driver's own reservations
sitting there makes ``cuMemAddressReserve`` grant another address.

Two things here:

* ``mappings_in`` / ``describe_taken`` read ``/proc/self/maps``, so a replay
  that cannot have its recorded range can say what holds it;
* ``kernel_zones`` models where x86-64 Linux places mappings (the layout
  ``arch/x86/mm/mmap.c`` computes), which is why the recorder's window base
  is ``0x200000000000`` (far from every zone) and not ``0x7f0000000000``
  (inside the zone where shared libraries and the driver's ranges go).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PAGE = 4096
TIB = 1 << 40
GIB = 1 << 30
MIB = 1 << 20
#: x86-64's user address space with 4-level page tables (DEFAULT_MAP_WINDOW = 2^47 - one page).
TASK_SIZE = (1 << 47) - PAGE
#: /proc/sys/vm/mmap_rnd_bits where it cannot be read (x86-64's default: 2^28 pages = 1 TiB).
DEFAULT_MMAP_RND_BITS = 28
#: How far a process's mappings may reach beyond the start of their zone (libraries, arenas, the
#: CUDA driver's own reservations): the model's assumption, generous for a single process.
DEFAULT_REACH = 1 * TIB
#: Stack limits (ulimit -s) the model covers: finite limits up to this, and unlimited.
MAX_FINITE_STACK = 1 * TIB
_STACK_GUARD_GAP = 256 * PAGE  # stack_guard_gap
_STACK_RND_MAX = 0x3FFFFF * PAGE  # stack_maxrandom_size on x86-64: ~16 GiB
_GAP_MIN = 128 * MIB
_GAP_MAX = TASK_SIZE // 6 * 5


@dataclass(frozen=True)
class Mapping:
    """One line of /proc/<pid>/maps."""

    start: int
    end: int
    perms: str
    path: str

    def describe(self) -> str:
        return f"{self.start:#x}-{self.end:#x} {self.perms} {self.path or '[anonymous]'}"


@dataclass(frozen=True)
class Zone:
    """A half-open address range ``[lo, hi)`` where the kernel may place a process's mappings."""

    name: str
    lo: int
    hi: int

    def overlaps(self, lo: int, hi: int) -> bool:
        return lo < self.hi and self.lo < hi


def parse_maps(text: str) -> list[Mapping]:
    """The mappings of a /proc/<pid>/maps text."""
    out = []
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 5 or "-" not in fields[0]:
            continue
        start, end = (int(part, 16) for part in fields[0].split("-", 1))
        out.append(Mapping(start, end, fields[1], fields[5].strip() if len(fields) > 5 else ""))
    return out


def read_maps(path: str | Path = "/proc/self/maps") -> list[Mapping] | None:
    """This process's mappings; None where /proc is not there (not Linux)."""
    try:
        return parse_maps(Path(path).read_text())
    except OSError:
        return None


def mappings_in(lo: int, hi: int, maps: list[Mapping] | None) -> list[Mapping]:
    """The mappings that overlap ``[lo, hi)``."""
    return [m for m in maps or () if m.start < hi and lo < m.end]


def describe_taken(lo: int, hi: int, maps: list[Mapping] | None = None, limit: int = 3) -> str:
    """What /proc/self/maps shows inside ``[lo, hi)`` ('' when nothing, or when it cannot be read)."""
    found = mappings_in(lo, hi, read_maps() if maps is None else maps)
    if not found:
        return ""
    shown = "; ".join(m.describe() for m in found[:limit])
    more = f"; and {len(found) - limit} more" if len(found) > limit else ""
    return f"/proc/self/maps has there: {shown}{more}"


def mmap_rnd_bits() -> int:
    """The kernel's mmap randomization (bits of pages) from /proc/sys/vm/mmap_rnd_bits."""
    try:
        return int(Path("/proc/sys/vm/mmap_rnd_bits").read_text())
    except (OSError, ValueError):
        return DEFAULT_MMAP_RND_BITS


def _mmap_base_span(stack_limit: int | None, rnd: int) -> tuple[int, int]:
    """The lowest and highest mmap_base the kernel picks for a stack limit (None: unlimited), as
    mmap.c's mmap_base() computes it: the stack gap is the limit plus the stack's largest random
    offset and guard gap, clamped to [128 MiB, 5/6 TASK_SIZE]; then a random offset below rnd."""
    gap = _GAP_MAX if stack_limit is None else min(max(stack_limit + _STACK_RND_MAX + _STACK_GUARD_GAP, _GAP_MIN), _GAP_MAX)
    return TASK_SIZE - gap - rnd, TASK_SIZE - gap


def kernel_zones(rnd_bits: int | None = None, reach: int = DEFAULT_REACH) -> list[Zone]:
    """Where x86-64 Linux places a process's mappings, each zone grown by ``reach`` in the direction it fills.

    * ``mmap``: the top-down zone below the stack (shared libraries, anonymous
      mmaps, the CUDA driver's ranges) for stack limits up to ``MAX_FINITE_STACK``;
    * ``mmap, unlimited stack``: ``ulimit -s unlimited`` puts mmap_base at
      TASK_SIZE/6 (the largest stack gap), still top-down;
    * ``legacy bottom-up``: ``vm.legacy_va_layout`` or the ADDR_COMPAT_LAYOUT
      personality: upwards from TASK_SIZE/3;
    * ``PIE and brk``: position-independent executables load at 2/3 TASK_SIZE,
      their brk heap follows;
    * ``low``: non-PIE executables (0x400000) and their brk, 32-bit hints.
    """
    rnd = 1 << ((mmap_rnd_bits() if rnd_bits is None else rnd_bits) + 12)
    low_finite, _ = _mmap_base_span(MAX_FINITE_STACK, rnd)
    low_unlimited, high_unlimited = _mmap_base_span(None, rnd)
    legacy = TASK_SIZE // 3 // PAGE * PAGE
    pie = TASK_SIZE // 3 * 2
    return [
        Zone("mmap", low_finite - reach, TASK_SIZE),
        Zone("mmap, unlimited stack", low_unlimited - reach, high_unlimited),
        Zone("legacy bottom-up", legacy, legacy + rnd + reach),
        Zone("PIE and brk", pie, pie + rnd + 32 * MIB + reach),
        Zone("low", 0, reach),
    ]


def zones_overlapping(lo: int, hi: int, zones: list[Zone] | None = None) -> list[Zone]:
    """The kernel zones ``[lo, hi)`` lies in (see ``kernel_zones``)."""
    return [z for z in (kernel_zones() if zones is None else zones) if z.overlaps(lo, hi)]
