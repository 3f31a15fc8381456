"""Texture and surface objects at replay: the CUDA arrays, the objects, and their new handles.

A recorded launch that reads texture or surface objects lists them
(``InstanceRecord.textures``, :mod:`mneme.format.textures`) and its snapshots
hold the contents of the CUDA arrays behind them (regions of kind ``array``).
In the replay's context this module

* creates every array with its recorded shape and fills it from the prologue
  (through a linear device copy of the prologue: the reset source, as for any
  region the kernel writes), and keeps the expected epilogue on the device;
* creates every object with its recorded descriptors, over the new array or
  over the linear or pitched memory at its replay address (the heap's, moved
  with it when the heap is relocated);
* writes each object's new handle where the recording says the kernel finds
  it: the argument words (``args``) and the words of captured memory
  (``memory``: in the restored prologue, and in the expected epilogue where the
  kernel left the word as it was), and nowhere else;
* gives the arrays to the replay as regions like the heap's (kind
  ``array``): reset from the prologue before a launch
  (:class:`ArrayCopy` entries among the resets), copied after each checked
  launch into a linear buffer (``live``) that the checks compare with the
  expected epilogue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

from mneme.errors import ArtifactError
from mneme.format.snapshot import Region
from mneme.format.textures import ArrayShape, TextureObject

HANDLE_SIZE = 8


class ArrayCopy(NamedTuple):
    """A whole CUDA array filled from packed rows of linear device memory (a reset entry).

    ``size`` is third, where a linear reset ``(dst, src, size)`` has its size, so that code adding up the
    bytes of the resets counts it.
    """

    array: int
    linear: int
    size: int
    width_bytes: int
    height: int
    depth: int

    def engine(self) -> tuple[int, int, int, int, int]:
        """The engine's form: (array, linear, width_bytes, height, depth)."""
        return (self.array, self.linear, self.width_bytes, self.height, self.depth)


def split_resets(resets: Sequence[Any]) -> tuple[list, list]:
    """(linear copies ``(dst, src, size)``, array fills in the engine's form) of a list of resets."""
    linear, arrays = [], []
    for r in resets:
        if isinstance(r, ArrayCopy):
            arrays.append(r.engine())
        else:
            linear.append(r)
    return linear, arrays


def _write_handle(data: bytearray, offset: int, value: int) -> None:
    data[offset : offset + HANDLE_SIZE] = value.to_bytes(HANDLE_SIZE, "little")


def _handle_at(data: bytes | bytearray, offset: int) -> int:
    return int.from_bytes(data[offset : offset + HANDLE_SIZE], "little")


@dataclass
class _Object:
    record: TextureObject
    engine: Any  # the engine's SamplerObject
    handle: int  # its handle here


class TextureState:
    """The instance's CUDA arrays and texture and surface objects, recreated in the replay's context.

    Args:
        ctx: the engine's context.
        objects: the recorded objects (``InstanceRecord.textures``).
        arrays: the ``array`` regions of the prologue and the epilogue, paired (``state.pair_regions``).
        translate: the replay address of a recorded heap address (None: not in the restored heap).

    Raises:
        ArtifactError: an object names an array the snapshots lack, or memory the recording does not hold.
        Exception: the engine's CudaError when the driver refuses an array or an object.
    """

    def __init__(
        self,
        ctx: Any,
        objects: Sequence[TextureObject],
        arrays: Sequence[tuple[Region, Region]],
        translate: Callable[[int], int | None],
    ):
        self.ctx = ctx
        self.records = tuple(objects)
        self.pairs = list(arrays)
        self.arrays: dict[int, Any] = {}  # recorded array handle -> engine Array
        self.objects: list[_Object] = []
        self.regions: list[Any] = []  # state.RegionState of kind "array", once restored
        self.shapes: dict[int, ArrayShape] = {}
        self.readback_buffers: list[Any] = []
        try:
            for p, _ in self.pairs:
                shape = p.array
                self.arrays[p.base] = ctx.create_array(shape.width, shape.height, shape.depth, shape.format,
                                                       shape.channels, shape.flags)  # fmt: skip
            for o in self.records:
                self.objects.append(self._create(o, translate))
        except BaseException:
            self.close()
            raise

    def _create(self, o: TextureObject, translate: Callable[[int], int | None]) -> _Object:
        resource = o.resource.to_dict()
        if o.resource.type == "array":
            array = self.arrays.get(o.resource.array)
            if array is None:
                raise ArtifactError(
                    f"{o.label} reads CUDA array {o.resource.array:#x}, which the recording's snapshots do not hold"
                )
            resource["array"] = array.handle
        else:
            start, end = translate(o.resource.address), translate(o.resource.address + o.resource.extent - 1)
            if start is None or end is None or end - start != o.resource.extent - 1:
                raise ArtifactError(
                    f"{o.label} reads {o.resource.extent} bytes at {o.resource.address:#x}, which the recording "
                    "does not hold as one heap region"
                )
            resource["address"] = start
        if o.kind == "surface":
            engine = self.ctx.surface_object(resource)
        else:
            view = None if o.view is None else o.view.to_dict()
            engine = self.ctx.texture_object(resource, o.texture.to_dict(), view)
        return _Object(o, engine, int(engine.handle))

    # -- handles --------------------------------------------------------------------------
    @property
    def moved(self) -> bool:
        """Whether any object's handle here differs from the recorded one (the args and memory change)."""
        return any(o.handle != o.record.handle for o in self.objects)

    def patch_args(self, args: bytes) -> bytes:
        """The argument bytes with every recorded handle site holding the object's new handle."""
        if not self.objects:
            return args
        out = bytearray(args)
        for o in self.objects:
            for offset in o.record.args:
                if _handle_at(out, offset) != o.record.handle:
                    raise ArtifactError(
                        f"{o.record.label}: the recorded arguments hold {_handle_at(out, offset):#x} at byte {offset}, "
                        "not its handle; the recording is inconsistent"
                    )
                _write_handle(out, offset, o.handle)
        return bytes(out)

    def patch_memory(self, base: int, prologue: bytearray, epilogue: bytearray) -> int:
        """Write the new handles into a region's restored bytes (recorded at ``base``), in place.

        The prologue must hold the recorded handle at every site (else the recording is inconsistent); the
        epilogue gets the new handle where it still holds the recorded one (the kernel left the word).

        Returns:
            How many sites the region holds.
        """
        sites = 0
        end = base + len(prologue)
        for o in self.objects:
            for address in o.record.memory:
                if not base <= address <= end - HANDLE_SIZE:
                    continue
                offset = address - base
                if _handle_at(prologue, offset) != o.record.handle:
                    raise ArtifactError(
                        f"{o.record.label}: the prologue holds {_handle_at(prologue, offset):#x} at {address:#x}, not its "
                        "handle; the recording is inconsistent"
                    )
                _write_handle(prologue, offset, o.handle)
                if _handle_at(epilogue, offset) == o.record.handle:
                    _write_handle(epilogue, offset, o.handle)
                sites += 1
        return sites

    def memory_sites_outside(self, ranges: Sequence[tuple[int, int]]) -> list[tuple[TextureObject, int]]:
        """Memory sites that lie in none of ``ranges`` ((base, size) of the restored regions)."""
        out = []
        for o in self.objects:
            for address in o.record.memory:
                if not any(b <= address and address + HANDLE_SIZE <= b + s for b, s in ranges):
                    out.append((o.record, address))
        return out

    # -- arrays -----------------------------------------------------------------------------
    def restore(self, store: Any, written: Callable[[Region, Region], list], region: Callable[..., Any]) -> list:
        """The arrays' device copies (expected epilogue, pristine prologue of written ones, the readback
        buffer) and their contents: the prologue.

        Args:
            store: the recording's store.
            written: the spans of a region pair the kernel changes (``state.written_spans``).
            region: makes the replay's region of an array (``state.RegionState``, kind ``array``).

        Returns:
            The arrays' regions: ``live`` is the buffer each array is copied into after a checked launch.
        """
        ctx = self.ctx
        for p, e in self.pairs:
            state = region("array", p.name, p.base, p.size, e.policy or p.policy, written(p, e))
            self.regions.append(state)
            self.shapes[p.base] = p.array
            pro, epi = p.read(store), e.read(store)
            state.expected = ctx.alloc(p.size)
            ctx.upload(state.expected.ptr, epi)
            if state.written:
                state.pristine = ctx.alloc(p.size)
                ctx.upload(state.pristine.ptr, pro)
            readback = ctx.alloc(p.size)
            self.readback_buffers.append(readback)
            state.live = readback.ptr
            self.fill(state)
        return list(self.regions)

    def reset_copy(self, region: Any) -> ArrayCopy:
        """The array of ``region`` filled from its reset source (its prologue)."""
        s = self.shapes[region.recorded_base]
        return ArrayCopy(self.arrays[region.recorded_base].handle, region.reset_source, region.size, s.row_bytes,
                         s.rows, s.slices)  # fmt: skip

    def fill(self, region: Any) -> None:
        """The array of ``region`` set to its prologue, now."""
        c = self.reset_copy(region)
        self.ctx.copy_to_array(c.array, c.linear, c.width_bytes, c.height, c.depth)

    def readbacks(self) -> list[tuple[int, int, int, int, int]]:
        """The engine's copies of every array into its region's ``live`` buffer (after a checked launch)."""
        out = []
        for r in self.regions:
            s = self.shapes[r.recorded_base]
            out.append((self.arrays[r.recorded_base].handle, r.live, s.row_bytes, s.rows, s.slices))
        return out

    @property
    def device_bytes(self) -> int:
        """Device memory the arrays and their readback buffers hold (their reset copies count as regions)."""
        return sum(2 * r.size for r in self.regions)

    def close(self) -> None:
        for o in self.objects:
            o.engine.free()
        self.objects = []
        for b in self.readback_buffers:
            b.free()
        self.readback_buffers = []
        for a in self.arrays.values():
            a.free()
        self.arrays = {}
