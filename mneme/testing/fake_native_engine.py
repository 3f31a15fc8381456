"""A stand-in for the native engine (``mneme._engine``) that tests the replay's placement on the CPU.

Modelled: contexts, the address space (reservations at exact bases, refused
like the driver's when the range is taken: by another reservation, by a
simulated host mapping, or by a real mapping of this process in
/proc/self/maps), device buffers as byte arrays, CUDA arrays (their contents
as bytes, filled from and copied into buffers) and texture and surface
objects (their descriptors kept, handles from 0x1001 up: never the small
numbers an application's objects have, so a replay must rewrite them). Loading a module fails
(CUDA_ERROR_INVALID_IMAGE), so a run ends with a ``compile_error`` result that
still carries the placement's fields, unless the address space has a
:class:`FakeKernel` (``AddressSpace.kernel``): then modules load, and their
function's ``run`` returns what the native one does (times, per checked launch
the statistics of every check) without touching memory; the kernel says which
checks differ from the epilogue, and records every run's arguments.

The profiler (hardware counters) is modelled too: a chip (``AddressSpace.chip``)
whose metrics are :data:`FAKE_METRICS`, configurations, and ``profile``, which
returns the kernel's ``counters`` (raw name -> value) and records each call;
``AddressSpace.profiler_reason`` makes the profiler unavailable and
``FakeKernel.profile_errors`` makes the next profile calls fail as CUPTI does.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

from mneme.replay.address_map import mappings_in, read_maps
from mneme.replay.metrics import CURATED

GRANULARITY = 2 << 20
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_IMAGE = 200
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_LAUNCH_TIMEOUT = 702
#: What the fake driver says of a loaded kernel (``Function.attributes``), unless the FakeKernel says otherwise.
KERNEL_ATTRIBUTES = {
    "num_regs": 16, "local_size_bytes": 0, "const_size_bytes": 0, "shared_size_bytes": 0,
    "max_threads_per_block": 1024, "max_dynamic_shared_size_bytes": 48 * 1024,
}  # fmt: skip
#: Dynamic shared memory a kernel can opt into (``set_attribute`` refuses more, as the H100's driver does).
MAX_DYNAMIC_SHARED = 227 * 1024


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
    kernel: "FakeKernel | None" = None  # what loaded modules launch; None: loading a module fails
    chip: str = "GH100"  # CUPTI's name of the fake GPU's chip
    profiler_reason: str = ""  # why the profiler cannot be loaded ('' when it can)
    copied_since_run: bool = True  # device copies (resets) made since the last run
    batches: list = field(default_factory=list)  # the size of every ``Context.run_batch`` call
    hung: list = field(default_factory=list)  # batches enqueued with a kernel that never ends (FakeKernel.hangs)
    blocked: list = field(default_factory=list)  # calls that would have waited for one of them (then raised)
    arrays: dict = field(default_factory=dict)  # handle -> FakeArray, live ones
    objects: dict = field(default_factory=dict)  # handle -> FakeObject, live ones
    _next_buffer: itertools.count = field(default_factory=lambda: itertools.count(0x7E0000000000, 1 << 24))
    _next_array: itertools.count = field(default_factory=lambda: itertools.count(0x5A0000, 0x100))
    _next_object: itertools.count = field(default_factory=lambda: itertools.count(0x1001))

    def wait_for_device(self, call: str) -> None:
        """A call that waits for the work enqueued on the device (a synchronous copy, a synchronous launch's
        wait): behind a batch whose kernel never ends it would wait forever; here it is recorded in
        ``blocked`` and raises CUDA_ERROR_LAUNCH_TIMEOUT, as a bounded wait does."""
        if self.hung:
            self.blocked.append(call)
            raise _error(f"{call} (waits for a kernel enqueued before it that never ends)", CUDA_ERROR_LAUNCH_TIMEOUT,
                         "CUDA_ERROR_LAUNCH_TIMEOUT")

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


@dataclass
class FakeArray:
    """A CUDA array: its descriptor and its contents (packed rows)."""

    handle: int
    shape: tuple  # (width, height, depth, format, channels, flags)
    data: bytearray
    space: "AddressSpace"

    def free(self) -> None:
        self.space.arrays.pop(self.handle, None)


@dataclass
class FakeObject:
    """A texture or surface object: the descriptors it was created with."""

    handle: int
    surface: bool
    resource: dict
    texture: dict | None
    view: dict | None
    space: "AddressSpace"

    def free(self) -> None:
        self.space.objects.pop(self.handle, None)


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
        self.space.wait_for_device("cuMemcpyHtoD")
        for buf in self.buffers.values():
            if buf.ptr <= ptr < buf.ptr + buf.size:
                off = ptr - buf.ptr
                buf.data[off : off + len(data)] = data

    def download(self, ptr: int, size: int) -> bytes:
        self.space.wait_for_device("cuMemcpyDtoH")
        for buf in self.buffers.values():
            if buf.ptr <= ptr < buf.ptr + buf.size:
                off = ptr - buf.ptr
                return bytes(buf.data[off : off + size])
        return bytes(size)

    def copy(self, dst: int, src: int, size: int) -> None:
        self.space.wait_for_device("cuMemcpyDtoD")
        self.space.copied_since_run = True  # a reset: the next run starts from the recorded memory

    def start_batch(self, items: list, gate_max_ns: int = 1_000_000_000) -> "FakeBatchRun":
        """The native ``Context.start_batch``: each item (function, grid, block, shared_mem, args, launches,
        before, resets, checks, check_launches, attributes, param_offsets) runs as its
        function's ``run`` would, after its ``before`` copies (a reset from the recorded memory); an error
        of any item ends the whole batch, raised by ``wait`` (as the native synchronization reports it)."""
        self.space.batches.append(len(items))
        outs, error, hangs = [], None, False
        try:
            for (function, grid, block, shared_mem, args, launches, before, resets, checks, check_launches,
                 attributes, param_offsets) in items:  # fmt: skip
                if before:
                    self.space.copied_since_run = True
                outs.append(function.run(grid, block, shared_mem, args, launches, resets=resets, checks=checks,
                                         check_launches=check_launches, attributes=attributes,
                                         param_offsets=param_offsets, enqueued=True))  # fmt: skip
                hangs = hangs or function.module.kernel.hung_last
        except CudaError as exc:
            error = exc
        batch = FakeBatchRun(outs, error, sum(item[5] for item in items), hangs)
        if hangs:
            self.space.hung.append(batch)
        return batch

    def run_batch(self, items: list, timeout_s: float = 0.0, gate_max_ns: int = 1_000_000_000) -> list:
        """The native ``Context.run_batch``: ``start_batch``, then ``wait``."""
        return self.start_batch(items, gate_max_ns).wait(timeout_s)

    def create_array(self, width: int, height: int, depth: int, format: int, channels: int, flags: int = 0) -> FakeArray:
        from mneme.format.textures import ArrayShape

        size = ArrayShape(width, height, depth, format, channels, flags).size
        array = FakeArray(next(self.space._next_array), (width, height, depth, format, channels, flags),
                          bytearray(size), self.space)  # fmt: skip
        self.space.arrays[array.handle] = array
        return array

    def _array(self, handle: int, width_bytes: int, height: int, depth: int) -> FakeArray:
        array = self.space.arrays.get(handle)
        if array is None or width_bytes * height * depth != len(array.data):
            raise _error("cuMemcpy3D", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE")
        return array

    def copy_to_array(self, array: int, src: int, width_bytes: int, height: int, depth: int) -> None:
        target = self._array(array, width_bytes, height, depth)
        target.data[:] = self.download(src, len(target.data))
        self.space.copied_since_run = True  # a reset, like copy()

    def copy_from_array(self, dst: int, array: int, width_bytes: int, height: int, depth: int) -> None:
        self.upload(dst, bytes(self._array(array, width_bytes, height, depth).data))

    def texture_object(self, resource: dict, texture: dict, view: dict | None = None) -> FakeObject:
        return self._object(False, resource, texture, view)

    def surface_object(self, resource: dict) -> FakeObject:
        return self._object(True, resource, None, None)

    def _object(self, surface: bool, resource: dict, texture: dict | None, view: dict | None) -> FakeObject:
        if resource.get("type") == "array" and resource.get("array") not in self.space.arrays:
            raise _error("cuTexObjectCreate", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE")
        obj = FakeObject(next(self.space._next_object), surface, dict(resource), texture, view, self.space)
        self.space.objects[obj.handle] = obj
        return obj

    def load_module(self, image: bytes, options: dict | None = None):
        if self.space.kernel is None:
            raise _error("cuModuleLoadData", CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE")
        return FakeModule(bytes(image), self.space.kernel, self.space)


@dataclass
class FakeRun:
    """One call of a fake function's ``run``: its arguments, and the image of the module it came from."""

    image: bytes
    grid: tuple
    block: tuple
    shared_mem: int
    launches: int
    resets: list
    checks: list
    check_launches: list
    queue_ahead_ns: int
    l2_scrub_bytes: int
    timeout_s: float
    cupti: bool
    attributes: list
    param_offsets: list
    array_resets: list = field(default_factory=list)
    array_readbacks: list = field(default_factory=list)
    args: bytes = b""
    from_recorded: bool = True  # the memory was reset (copies) since the previous run


@dataclass
class FakeKernel:
    """What the kernels of modules the fake driver loads do when launched.

    ``differs(run, launch, check)`` gives how far check ``check`` (its index in
    ``run.checks``) is from the epilogue after launch ``launch``: 0 matches it;
    n > 0 is n differing bytes (bytewise check) or n elements n ULP apart (typed
    check; a violation where n exceeds the threshold). ``errors`` are raised by
    the next runs, one each (CudaError from :func:`cuda_error`; None lets its run
    through). ``runs`` records every run.
    """

    attributes: dict = field(default_factory=lambda: dict(KERNEL_ATTRIBUTES))
    globals: dict = field(default_factory=dict)  # name -> size, the module globals a loaded module has
    differs: Callable[[FakeRun, int, int], int] | None = None
    errors: list = field(default_factory=list)
    runs: list = field(default_factory=list)
    time_ns: int = 1000
    load_seconds: float = 0.001
    counters: dict = field(default_factory=dict)  # raw metric -> what the profiler reports (absent: 0.0)
    profile_errors: list = field(default_factory=list)  # raised by the next profile calls, one each
    profiles: list = field(default_factory=list)  # every profile call's arguments (FakeProfile)
    hangs: Callable[[FakeRun], bool] | None = None  # whether a run's kernel never ends
    hung_last: bool = False  # (whether the last run's did)


def cuda_error(call: str, code: int, name: str) -> CudaError:
    """A CudaError as the native engine raises it (``FakeKernel.errors``)."""
    return _error(call, code, name)


class FakeBatchRun:
    """What ``FakeContext.start_batch`` returns: ``wait`` gives the items' outputs (or raises the error)."""

    def __init__(self, outs: list, error: BaseException | None, launches: int, hangs: bool = False):
        self.outs, self.error, self.launches, self.hangs = outs, error, launches, hangs
        self.waited = False

    def done(self) -> bool:
        return not self.hangs

    def wait(self, timeout_s: float = 0.0) -> list:
        if self.waited:
            raise RuntimeError("this batch's results were taken already")
        self.waited = True
        if self.hangs:  # (a batch enqueued before it that hangs makes it hang too: it is in ``hung`` then)
            raise _error("cuEventQuery (a kernel of the batch never ends)", CUDA_ERROR_LAUNCH_TIMEOUT,
                         "CUDA_ERROR_LAUNCH_TIMEOUT")
        if self.error is not None:
            raise self.error
        return self.outs


class FakeModule:
    def __init__(self, image: bytes, kernel: FakeKernel, space: AddressSpace):
        self.image, self.kernel, self.load_seconds = image, kernel, kernel.load_seconds
        self._globals: dict[str, int] = {}
        self._space = space

    def function(self, name: str) -> "FakeFunction":
        return FakeFunction(self)

    def global_(self, name: str) -> tuple[int, int]:
        if name not in self.kernel.globals:
            raise _error("cuModuleGetGlobal", CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND")
        if name not in self._globals:
            self._globals[name] = next(self._space._next_buffer)
        return self._globals[name], self.kernel.globals[name]


class FakeFunction:
    def __init__(self, module: FakeModule):
        self.module = module
        self._attributes = dict(module.kernel.attributes)

    def attributes(self) -> dict:
        return dict(self._attributes)

    def set_attribute(self, name: str, value: int) -> None:
        if name == "max_dynamic_shared_size_bytes" and value > MAX_DYNAMIC_SHARED:
            raise _error("cuFuncSetAttribute", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE")
        self._attributes[name] = value

    def param_info(self) -> list:
        return []

    def run(self, grid, block, shared_mem, args, launches, resets=(), checks=(), check_launches=(),
            queue_ahead_ns=0, l2_scrub_bytes=0, timeout_s=0.0, cupti=False, attributes=(), param_offsets=(),
            array_resets=(), array_readbacks=(), enqueued=False):
        kernel = self.module.kernel
        space = self.module._space
        if not enqueued:  # the native run waits for its stream: for what was enqueued before it too
            space.wait_for_device("cuStreamSynchronize")
        run = FakeRun(self.module.image, tuple(grid), tuple(block), int(shared_mem), int(launches), list(resets),
                      list(checks), list(check_launches), int(queue_ahead_ns), int(l2_scrub_bytes),
                      float(timeout_s), bool(cupti), list(attributes), list(param_offsets), list(array_resets),
                      list(array_readbacks), bytes(args))  # fmt: skip
        run.from_recorded = space.copied_since_run
        space.copied_since_run = False
        kernel.runs.append(run)
        kernel.hung_last = bool(kernel.hangs and kernel.hangs(run))
        if kernel.hung_last and not enqueued:  # a bounded wait gives up; the context is lost with the kernel
            space.hung.append(run)
            raise _error("cuStreamQuery (the kernel never ends)", CUDA_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT")
        error = kernel.errors.pop(0) if kernel.errors else None
        if error is not None:
            raise error
        checked = sorted({i for i in run.check_launches if 0 <= i < run.launches})
        per_launch = [[_check_result(c, kernel.differs(run, launch, i) if kernel.differs else 0)
                       for i, c in enumerate(run.checks)] for launch in checked]  # fmt: skip
        times = [kernel.time_ns] * run.launches
        return {"times_ns": times, "checked_launches": checked, "checks": per_launch,
                "wall_ns": kernel.time_ns * run.launches + 5000, "gpu_span_ns": kernel.time_ns * run.launches,
                "event_times_ns": list(times)}  # fmt: skip


#: The raw metrics the fake chip has: the first raw metric of every curated one, and a few more.
FAKE_METRICS = frozenset([m.raw[0] for m in CURATED.values() if "imc_miss" not in m.raw[0]] +
                         ["lts__t_sectors_op_read.sum", "lts__t_sectors_op_write.sum", "dram__sectors_read.sum"])
CUPTI_ERROR_INVALID_METRIC_NAME = 17
CUPTI_ERROR_INSUFFICIENT_PRIVILEGES = 35


class ProfilerError(RuntimeError):
    """As the engine raises it: (message, CUptiResult, its name, the call)."""


def profiler_error(call: str, code: int, name: str) -> ProfilerError:
    """A ProfilerError as the native engine raises it (``FakeKernel.profile_errors``)."""
    return ProfilerError(f"{call} failed: {name} ({code})", code, name, call)


@dataclass
class FakeProfile:
    """One call of the fake ``profile``: its arguments."""

    config: "FakeMetricConfig"
    grid: tuple
    block: tuple
    shared_mem: int
    args: bytes
    resets: list
    l2_flush_bytes: int
    timeout_s: float
    attributes: list
    param_offsets: list


class FakeMetricConfig:
    """``mneme._engine.MetricConfig``: metrics on a chip, one pass per three of them."""

    def __init__(self, chip: str, metrics: list, counter_availability: bytes = b""):
        for name in metrics:
            _metric_properties(chip, name)
        self.chip, self.metrics, self.counter_availability = chip, list(metrics), counter_availability
        self.passes = -(-len(self.metrics) // 3)


def _metric_properties(chip: str, name: str) -> dict:
    if name not in FAKE_METRICS:
        raise profiler_error(f"cuptiProfilerHostGetMetricProperties({name})", CUPTI_ERROR_INVALID_METRIC_NAME,
                             "CUPTI_ERROR_INVALID_METRIC_NAME")
    return {"description": name, "hw_unit": name.split("__")[0], "dim_unit": "", "type": 0}


def _base_metrics(chip: str, type_: int) -> list:
    return sorted({m.split(".")[0] for m in FAKE_METRICS}) if type_ == 0 else []


def _sub_metrics(chip: str, base: str, type_: int) -> list:
    return sorted({m[len(base):] for m in FAKE_METRICS if m.startswith(base + ".")})


def _profile(function: "FakeFunction", config: FakeMetricConfig, grid, block, shared_mem, args, resets=(),
             l2_flush_bytes=0, timeout_s=0.0, attributes=(), param_offsets=()) -> dict:
    kernel = function.module.kernel
    kernel.profiles.append(FakeProfile(config, tuple(grid), tuple(block), int(shared_mem), bytes(args), list(resets),
                                       int(l2_flush_bytes), float(timeout_s), list(attributes), list(param_offsets)))
    error = kernel.profile_errors.pop(0) if kernel.profile_errors else None
    if error is not None:
        raise error
    return {"values": [float(kernel.counters.get(m, 0.0)) for m in config.metrics], "passes": config.passes,
            "ranges_dropped": 0}


def _check_result(check: tuple, n: int) -> tuple[tuple, tuple]:
    """The engine's (stats[7], counters[11]) for a check ``n`` away from the epilogue (see FakeKernel)."""
    dtype, threshold = check[3], check[5]
    diff = n * 1e-7
    stats = (diff * n, diff * diff * n, diff, 1.0, 1.0, 1.0, diff)
    if dtype < 0:  # bytewise: differing bytes, first offset
        counters = (n, 0, 0, 0, 0)
    else:  # typed: violations, first violation, NaN mismatches, differing elements, max ULP
        counters = (n if n > threshold else 0, 0, 0, n, n)
    hashes = (n, 0, n, 0, 0, 0)  # this side's multiset (2) and positional hash, then the epilogue's
    return stats, counters + hashes


def native_module(space: AddressSpace) -> SimpleNamespace:
    """What ``mneme.replay.engine`` uses of ``mneme._engine``, on ``space``."""
    return SimpleNamespace(
        CudaError=CudaError,
        Context=lambda device=0: FakeContext(space, device),
        driver_available=lambda: True,
        driver_unavailable_reason=lambda: "",
        cupti_unavailable_reason=lambda: "no CUPTI in the fake engine",
        abandon_cleanup=lambda: None,
        ProfilerError=ProfilerError,
        MetricConfig=FakeMetricConfig,
        profiler_unavailable_reason=lambda: space.profiler_reason,
        profiler_chip_name=lambda device: space.chip,
        profiler_device_support=lambda device: {"overall": 3, "architecture": 3, "sli": 3, "vgpu": 3,
                                                "confidential_compute": 3, "cmp": 3, "wsl": 3},
        profiler_counter_availability=lambda ctx: b"fake-availability",
        profiler_metric_properties=_metric_properties,
        profiler_base_metrics=_base_metrics,
        profiler_sub_metrics=_sub_metrics,
        profile=_profile,
    )
