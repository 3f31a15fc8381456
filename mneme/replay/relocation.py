"""Moving recorded memory: where each recorded range lives now, and the pointers that must follow.

A replay restores heap buffers at their recorded addresses when it can (the
recorder's fixed window); module globals always live wherever the driver puts
them in the module the replay loaded, and a relocatable recording's heap
buffers go wherever the replay can allocate them. Kernel arguments and 8-byte
aligned values in memory that point into a recorded range are then rewritten
to point to the same byte of its new home.

A value in memory is taken as a pointer when it falls inside a recorded
range (half-open ``[base, base + size)``); in the address ranges involved (tens
of terabytes up) that is very unlikely to be a coincidence, but it can be:
the replay reports that it relocated, so a failed verification can be read
in that light.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:
    import numpy as np  # imported where pointers are scanned: a replay that never scans does not pay for numpy

POINTER_SIZE = 8


@dataclass(frozen=True)
class Move:
    """The recorded range ``[recorded, recorded + size)`` now starts at ``current``."""

    recorded: int
    size: int
    current: int

    @property
    def moved(self) -> bool:
        return self.recorded != self.current


class RelocationMap:
    """Recorded ranges and their current homes; translates addresses."""

    def __init__(self, moves: Iterable[Move]):
        self.moves = sorted((m for m in moves if m.size > 0), key=lambda m: m.recorded)
        self._starts = [m.recorded for m in self.moves]
        for a, b in zip(self.moves, self.moves[1:]):
            if b.recorded < a.recorded + a.size:
                raise ValueError(f"recorded ranges {a.recorded:#x} and {b.recorded:#x} overlap")

    @property
    def is_identity(self) -> bool:
        return not any(m.moved for m in self.moves)

    def translate(self, address: int) -> int | None:
        """The current address of a recorded one, None when it is in no recorded range."""
        i = bisect.bisect_right(self._starts, address) - 1
        if i < 0:
            return None
        m = self.moves[i]
        if address >= m.recorded + m.size:
            return None
        return m.current + (address - m.recorded)

    def pointer_sites(self, data: bytes | bytearray | memoryview, start_alignment: int = 0) -> np.ndarray:
        """Byte offsets of the 8-byte aligned values in ``data`` that point into a recorded range.

        ``start_alignment`` is the address of ``data[0]`` modulo 8, so alignment
        is judged on device addresses, not buffer offsets.
        """
        import numpy as np

        skip = (-start_alignment) % POINTER_SIZE
        view = memoryview(data)[skip:]
        count = len(view) // POINTER_SIZE
        if count == 0 or not self.moves:
            return np.empty(0, dtype=np.int64)
        values = np.frombuffer(view[: count * POINTER_SIZE], dtype="<u8")
        hit = np.zeros(count, dtype=bool)
        for m in self.moves:
            hit |= (values >= np.uint64(m.recorded)) & (values < np.uint64(m.recorded + m.size))
        return np.nonzero(hit)[0].astype(np.int64) * POINTER_SIZE + skip

    def patch(self, data: bytearray, sites: np.ndarray, original: np.ndarray) -> None:
        """Write the translation of each ``original`` value at its site (in place)."""
        import numpy as np

        if len(sites) == 0:
            return
        out = np.frombuffer(data, dtype=np.uint8)
        new = np.array([self.translate(int(v)) for v in original], dtype="<u8")
        for site, value in zip(sites.tolist(), new.view(np.uint8).reshape(-1, POINTER_SIZE)):
            out[site : site + POINTER_SIZE] = value

    def patch_args(self, args: bytes, pointer_offsets: Sequence[int]) -> bytes:
        """The argument buffer with every pointer argument that points into a recorded range translated."""
        out = bytearray(args)
        for off in pointer_offsets:
            if off + POINTER_SIZE > len(out):
                continue
            value = int.from_bytes(out[off : off + POINTER_SIZE], "little")
            new = self.translate(value)
            if new is not None:
                out[off : off + POINTER_SIZE] = new.to_bytes(POINTER_SIZE, "little")
        return bytes(out)


def read_values(data: bytes | bytearray | memoryview, sites: np.ndarray) -> np.ndarray:
    """The 8-byte little-endian values at ``sites``."""
    import numpy as np

    raw = np.frombuffer(data, dtype=np.uint8)
    if len(sites) == 0:
        return np.empty(0, dtype="<u8")
    idx = sites[:, None] + np.arange(POINTER_SIZE)[None, :]
    return raw[idx].copy().view("<u8").reshape(-1)
