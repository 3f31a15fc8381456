"""A stand-in for the native engine (``mneme._engine``) that tests the replay's placement on the CPU.

Only what a ``Replayer`` does before its first launch is modelled: contexts, the
address space (reservations at exact bases, refused like the driver's when the
range is taken: by another reservation, by a simulated host mapping, or by a
real mapping of this process in /proc/self/maps), device buffers as byte
arrays. Loading a module fails (CUDA_ERROR_INVALID_IMAGE), so a run ends with a
``compile_error`` result that still carries the placement's fields.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace

from mneme.replay.address_map import mappings_in, read_maps

GRANULARITY = 2 << 20
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_IMAGE = 200
CUDA_ERROR_OUT_OF_MEMORY = 2


class CudaError(RuntimeError):
    """As the engine raises it: (message, code, name)."""


def _error(call: str, code: int, name: str) -> CudaError:
    return CudaError(f"{call} failed: {name} ({code})", code, name)


@dataclass
class AddressSpace:
    """The process's address space as the fake driver sees it."""

    host_mappings: list[tuple[int, int]] = field(default_factory=list)  # simulated [start, end) taken ranges
    reservations: list["FakeReservation"] = field(default_factory=list)
    reserve_calls: list[tuple[int, int]] = field(default_factory=list)
    fail_map_at: int | None = None  # an absolute address whose mapping fails (out of memory)
    allocations_left: int | None = None  # buffers ctx.alloc gives before it runs out of memory
    _next_buffer: itertools.count = field(default_factory=lambda: itertools.count(0x7E0000000000, 1 << 24))

    def taken(self, start: int, end: int) -> bool:
        if any(s < end and start < e for s, e in self.host_mappings):
            return True
        if any(r.base < end and start < r.base + r.size for r in self.reservations if r.reserved):
            return True
        return bool(mappings_in(start, end, read_maps()))


class FakeReservation:
    def __init__(self, space: AddressSpace, base: int, size: int):
        space.reserve_calls.append((base, size))
        if base % GRANULARITY:
            raise ValueError(f"window base {base} is not a multiple of the granularity {GRANULARITY}")
        self.size = -(-size // GRANULARITY) * GRANULARITY
        if space.taken(base, base + self.size):
            raise _error("cuMemAddressReserve at the recorded base (the driver offered another address: the range is "
                         "taken in this process)", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE")
        self.space, self.base, self.granularity = space, base, GRANULARITY
        self.mappings: dict[int, tuple[int, int]] = {}  # offset -> (size, device)
        self.reserved = True
        space.reservations.append(self)

    @property
    def mapped_bytes(self) -> int:
        return sum(size for size, _ in self.mappings.values())

    def map(self, offset: int, size: int, device: int = -1) -> None:
        if offset % GRANULARITY or size % GRANULARITY or size == 0 or offset + size > self.size:
            raise ValueError("map range must be non-empty, granularity-aligned and inside the reservation")
        if self.space.fail_map_at is not None and self.base + offset <= self.space.fail_map_at < self.base + offset + size:
            raise _error("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY")
        if any(o < offset + size and offset < o + s for o, (s, _) in self.mappings.items()):
            raise _error("cuMemMap", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE")
        self.mappings[offset] = (size, device)

    def unmap(self, offset: int, size: int) -> None:
        if self.mappings.get(offset, (None,))[0] != size:
            raise ValueError("unmap: no mapping at that offset with that size")
        del self.mappings[offset]

    def release(self) -> None:
        self.mappings.clear()
        self.reserved = False


class FakeBuffer:
    def __init__(self, ptr: int, size: int):
        self.ptr, self.size = ptr, size
        self.data = bytearray(size)

    def free(self) -> None:
        self.data = bytearray()


class FakeContext:
    compute_capability = (9, 0)
    l2_cache_size = 50 << 20

    def __init__(self, space: AddressSpace, device: int):
        self.space, self.device = space, device
        self.buffers: dict[int, FakeBuffer] = {}

    def allocation_granularity(self) -> int:
        return GRANULARITY

    def reserve(self, base: int, size: int) -> FakeReservation:
        return FakeReservation(self.space, base, size)

    def alloc(self, size: int) -> FakeBuffer:
        if self.space.allocations_left is not None:
            if self.space.allocations_left == 0:
                raise _error("cuMemAlloc", CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY")
            self.space.allocations_left -= 1
        buf = FakeBuffer(next(self.space._next_buffer), size)
        self.buffers[buf.ptr] = buf
        return buf

    def upload(self, ptr: int, data: bytes) -> None:
        for buf in self.buffers.values():
            if buf.ptr <= ptr < buf.ptr + buf.size:
                off = ptr - buf.ptr
                buf.data[off : off + len(data)] = data

    def copy(self, dst: int, src: int, size: int) -> None:
        pass

    def load_module(self, image: bytes):
        raise _error("cuModuleLoadData", CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE")


def native_module(space: AddressSpace) -> SimpleNamespace:
    """What ``mneme.replay.engine`` uses of ``mneme._engine``, on ``space``."""
    return SimpleNamespace(
        CudaError=CudaError,
        Context=lambda device=0: FakeContext(space, device),
        driver_available=lambda: True,
        driver_unavailable_reason=lambda: "",
        cupti_unavailable_reason=lambda: "no CUPTI in the fake engine",
        abandon_cleanup=lambda: None,
    )
