"""Texture and surface objects in a recording: the CUDA arrays' shapes and the objects' descriptors.

A launch that reads texture or surface objects is recorded with the objects
it reaches (``InstanceRecord.textures``, docs/format.md): each object's kind
(texture or surface), its handle in the recorded process, its resource (a CUDA
array, or linear or pitched device memory), its texture descriptor (textures)
and its resource view (when one was given), and where the kernel finds its
handle: byte offsets in the argument buffer (``args``) and device addresses in
captured memory (``memory``). A CUDA array's contents are a snapshot region of
kind ``array`` whose base is the array's handle in the recorded process and
whose ``array`` field is its shape (:class:`ArrayShape`): packed rows of
``width`` elements, ``height`` rows (1 for a 1-D array) per slice, ``depth``
slices (1 for a 2-D one).

Enumerations keep the CUDA driver's numbers (``CUarray_format``,
``CUaddress_mode``, ``CUfilter_mode``, the ``CU_TRSF_*`` and
``CUDA_ARRAY3D_*`` flags), so the replay hands them to the driver as recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mneme.format.schema import JsonReader

_U64 = 2**64
_U32 = 2**32 - 1

#: CUarray_format -> (name, bytes per channel): the formats the recorder copies.
ARRAY_FORMATS = {
    0x01: ("u8", 1), 0x02: ("u16", 2), 0x03: ("u32", 4), 0x08: ("i8", 1), 0x09: ("i16", 2), 0x0A: ("i32", 4),
    0x10: ("f16", 2), 0x20: ("f32", 4),
}  # fmt: skip
CHANNELS = (1, 2, 4)
#: CUDA_ARRAY3D_* flags an array the recorder captures may carry (surface load/store, texture gather).
ARRAY_FLAGS = 0x02 | 0x08
OBJECT_KINDS = ("texture", "surface")
RESOURCE_TYPES = ("array", "linear", "pitch2d")


def element_size(fmt: int, channels: int) -> int:
    """Bytes per element of an array or resource of ``fmt`` (CUarray_format) with ``channels`` channels."""
    return ARRAY_FORMATS[fmt][1] * channels


def _check_format(r: JsonReader, where: str, fmt: int, channels: int) -> None:
    if fmt not in ARRAY_FORMATS:
        known = ", ".join(f"{k:#x} ({v[0]})" for k, v in ARRAY_FORMATS.items())
        raise r.error(f"{where}.format", f"{fmt:#x} is not a format mneme records ({known})")
    if channels not in CHANNELS:
        raise r.error(f"{where}.channels", f"{channels} channels: expected 1, 2 or 4")


@dataclass(frozen=True)
class ArrayShape:
    """A CUDA array's descriptor (``CUDA_ARRAY3D_DESCRIPTOR``); height 0: 1-D, depth 0: 1-D or 2-D."""

    width: int
    height: int = 0
    depth: int = 0
    format: int = 0x20
    channels: int = 1
    flags: int = 0

    @property
    def element_size(self) -> int:
        return element_size(self.format, self.channels)

    @property
    def row_bytes(self) -> int:
        return self.width * self.element_size

    @property
    def rows(self) -> int:
        """Rows per slice (1 for a 1-D array)."""
        return max(self.height, 1)

    @property
    def slices(self) -> int:
        """Slices (1 for a 1-D or 2-D array)."""
        return max(self.depth, 1)

    @property
    def size(self) -> int:
        """Bytes of the contents packed: rows of ``row_bytes``, ``rows`` per slice, ``slices`` slices."""
        return self.row_bytes * self.rows * self.slices

    def to_dict(self) -> dict[str, Any]:
        return {"width": self.width, "height": self.height, "depth": self.depth, "format": self.format,
                "channels": self.channels, "flags": self.flags}  # fmt: skip

    @classmethod
    def parse(cls, r: JsonReader, value: Any, where: str) -> "ArrayShape":
        d = r.obj(value, where, required=("width", "height", "depth", "format", "channels", "flags"))
        shape = cls(
            r.int(d["width"], f"{where}.width", 1, _U32), r.int(d["height"], f"{where}.height", 0, _U32),
            r.int(d["depth"], f"{where}.depth", 0, _U32), r.int(d["format"], f"{where}.format", 0, _U32),
            r.int(d["channels"], f"{where}.channels", 0, _U32), r.int(d["flags"], f"{where}.flags", 0, _U32),
        )  # fmt: skip
        _check_format(r, where, shape.format, shape.channels)
        if shape.flags & ~ARRAY_FLAGS:
            raise r.error(f"{where}.flags", f"{shape.flags:#x}: only surface load/store (0x2) and texture gather "
                          "(0x8) arrays are recorded (layered, cubemap, sparse and others are not)")
        if shape.depth and not shape.height:
            raise r.error(where, "a 3-D array (depth > 0) needs a height")
        return shape


@dataclass(frozen=True)
class Resource:
    """What an object reads (``CUDA_RESOURCE_DESC``): a CUDA array, or linear or pitched device memory.

    ``array``: the recorded array's handle (its snapshot region's base). ``address``: the recorded device
    address of linear or pitched memory (inside a captured heap region; the replay moves it with the heap).
    """

    type: str
    array: int = 0
    address: int = 0
    format: int = 0
    channels: int = 0
    size: int = 0  # linear: bytes
    width: int = 0  # pitch2d: elements per row
    height: int = 0  # pitch2d: rows
    pitch: int = 0  # pitch2d: bytes from one row to the next

    @property
    def extent(self) -> int:
        """Bytes of device memory from ``address`` that the resource spans (0 for an array)."""
        if self.type == "linear":
            return self.size
        if self.type == "pitch2d":
            return self.pitch * (self.height - 1) + self.width * element_size(self.format, self.channels)
        return 0

    def to_dict(self) -> dict[str, Any]:
        if self.type == "array":
            return {"type": "array", "array": self.array}
        out = {"type": self.type, "address": self.address, "format": self.format, "channels": self.channels}
        if self.type == "linear":
            out["size"] = self.size
        else:
            out.update(width=self.width, height=self.height, pitch=self.pitch)
        return out

    @classmethod
    def parse(cls, r: JsonReader, value: Any, where: str) -> "Resource":
        kind = r.choice(r.mapping(value, where).get("type"), f"{where}.type", RESOURCE_TYPES)
        if kind == "array":
            d = r.obj(value, where, required=("type", "array"))
            return cls("array", array=r.int(d["array"], f"{where}.array", 1, _U64 - 1))
        memory = ("type", "address", "format", "channels")
        if kind == "linear":
            d = r.obj(value, where, required=(*memory, "size"))
            res = cls("linear", address=r.int(d["address"], f"{where}.address", 1, _U64 - 1),
                      format=r.int(d["format"], f"{where}.format", 0, _U32),
                      channels=r.int(d["channels"], f"{where}.channels", 0, _U32),
                      size=r.int(d["size"], f"{where}.size", 1, _U64 - 1))  # fmt: skip
        else:
            d = r.obj(value, where, required=(*memory, "width", "height", "pitch"))
            res = cls("pitch2d", address=r.int(d["address"], f"{where}.address", 1, _U64 - 1),
                      format=r.int(d["format"], f"{where}.format", 0, _U32),
                      channels=r.int(d["channels"], f"{where}.channels", 0, _U32),
                      width=r.int(d["width"], f"{where}.width", 1, _U32),
                      height=r.int(d["height"], f"{where}.height", 1, _U32),
                      pitch=r.int(d["pitch"], f"{where}.pitch", 1, _U64 - 1))  # fmt: skip
        _check_format(r, where, res.format, res.channels)
        if res.type == "pitch2d" and res.pitch < res.width * element_size(res.format, res.channels):
            raise r.error(f"{where}.pitch", f"{res.pitch} bytes is less than a row of {res.width} elements")
        if res.address + res.extent > _U64:
            raise r.error(where, "the resource passes the end of the 64-bit address space")
        return res


@dataclass(frozen=True)
class TextureDesc:
    """How a texture samples (``CUDA_TEXTURE_DESC``), with the driver's numbers."""

    address_mode: tuple[int, int, int] = (0, 0, 0)
    filter_mode: int = 0
    flags: int = 0
    max_anisotropy: int = 0
    mipmap_filter_mode: int = 0
    mipmap_level_bias: float = 0.0
    min_mipmap_level_clamp: float = 0.0
    max_mipmap_level_clamp: float = 0.0
    border_color: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "address_mode": list(self.address_mode), "filter_mode": self.filter_mode, "flags": self.flags,
            "max_anisotropy": self.max_anisotropy, "mipmap_filter_mode": self.mipmap_filter_mode,
            "mipmap_level_bias": self.mipmap_level_bias, "min_mipmap_level_clamp": self.min_mipmap_level_clamp,
            "max_mipmap_level_clamp": self.max_mipmap_level_clamp, "border_color": list(self.border_color),
        }  # fmt: skip

    @classmethod
    def parse(cls, r: JsonReader, value: Any, where: str) -> "TextureDesc":
        keys = ("address_mode", "filter_mode", "flags", "max_anisotropy", "mipmap_filter_mode", "mipmap_level_bias",
                "min_mipmap_level_clamp", "max_mipmap_level_clamp", "border_color")  # fmt: skip
        d = r.obj(value, where, required=keys)
        modes = r.list(d["address_mode"], f"{where}.address_mode")
        colors = r.list(d["border_color"], f"{where}.border_color")
        if len(modes) != 3:
            raise r.error(f"{where}.address_mode", "expected three address modes")
        if len(colors) != 4:
            raise r.error(f"{where}.border_color", "expected four numbers")
        return cls(
            tuple(r.int(m, f"{where}.address_mode[{i}]", 0, 3) for i, m in enumerate(modes)),  # type: ignore[arg-type]
            r.int(d["filter_mode"], f"{where}.filter_mode", 0, 1), r.int(d["flags"], f"{where}.flags", 0, _U32),
            r.int(d["max_anisotropy"], f"{where}.max_anisotropy", 0, _U32),
            r.int(d["mipmap_filter_mode"], f"{where}.mipmap_filter_mode", 0, 1),
            r.number(d["mipmap_level_bias"], f"{where}.mipmap_level_bias"),
            r.number(d["min_mipmap_level_clamp"], f"{where}.min_mipmap_level_clamp"),
            r.number(d["max_mipmap_level_clamp"], f"{where}.max_mipmap_level_clamp"),
            tuple(r.number(c, f"{where}.border_color[{i}]") for i, c in enumerate(colors)),  # type: ignore[arg-type]
        )  # fmt: skip


@dataclass(frozen=True)
class ViewDesc:
    """A resource view (``CUDA_RESOURCE_VIEW_DESC``): another format or a part of an array."""

    format: int = 0
    width: int = 0
    height: int = 0
    depth: int = 0
    first_mipmap_level: int = 0
    last_mipmap_level: int = 0
    first_layer: int = 0
    last_layer: int = 0

    _KEYS = ("format", "width", "height", "depth", "first_mipmap_level", "last_mipmap_level", "first_layer",
             "last_layer")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._KEYS}

    @classmethod
    def parse(cls, r: JsonReader, value: Any, where: str) -> "ViewDesc":
        d = r.obj(value, where, required=cls._KEYS)
        return cls(*(r.int(d[k], f"{where}.{k}", 0, _U64 - 1) for k in cls._KEYS))


@dataclass(frozen=True)
class TextureObject:
    """A texture or surface object a recorded launch reaches, and where the kernel finds its handle.

    ``args``: byte offsets of 8-byte words of the argument buffer that hold the handle; ``memory``: device
    addresses (8-byte aligned, in captured regions) that hold it. The replay creates the object anew and
    writes its new handle there, and nowhere else.
    """

    kind: str
    handle: int
    resource: Resource
    texture: TextureDesc | None = None
    view: ViewDesc | None = None
    args: tuple[int, ...] = ()
    memory: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.kind} object {self.handle:#x}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "handle": self.handle, "resource": self.resource.to_dict(),
            "texture": None if self.texture is None else self.texture.to_dict(),
            "view": None if self.view is None else self.view.to_dict(),
            "args": list(self.args), "memory": list(self.memory),
        }  # fmt: skip

    @classmethod
    def parse(cls, r: JsonReader, value: Any, where: str, arg_bytes: int) -> "TextureObject":
        d = r.obj(value, where, required=("kind", "handle", "resource", "texture", "view", "args", "memory"))
        kind = r.choice(d["kind"], f"{where}.kind", OBJECT_KINDS)
        handle = r.int(d["handle"], f"{where}.handle", 1, _U64 - 1)
        resource = Resource.parse(r, d["resource"], f"{where}.resource")
        texture = None if d["texture"] is None else TextureDesc.parse(r, d["texture"], f"{where}.texture")
        view = None if d["view"] is None else ViewDesc.parse(r, d["view"], f"{where}.view")
        if kind == "surface" and (texture is not None or view is not None or resource.type != "array"):
            raise r.error(where, "a surface object has an array resource and no texture descriptor or view")
        if kind == "texture" and texture is None:
            raise r.error(f"{where}.texture", "a texture object needs its texture descriptor")
        if view is not None and resource.type != "array":
            raise r.error(f"{where}.view", "only a texture over an array has a resource view")
        args = _sites(r, d["args"], f"{where}.args", 0, arg_bytes - 8)
        memory = _sites(r, d["memory"], f"{where}.memory", 0, _U64 - 8)
        if not args and not memory:
            raise r.error(where, "names no place that holds its handle (args, memory)")
        return cls(kind, handle, resource, texture, view, args, memory)


def _sites(r: JsonReader, value: Any, where: str, low: int, high: int) -> tuple[int, ...]:
    out: list[int] = []
    for i, v in enumerate(r.list(value, where)):
        if high < low:
            raise r.error(f"{where}[{i}]", "no 8-byte word fits there")
        v = r.int(v, f"{where}[{i}]", low, high)
        if v % 8:
            raise r.error(f"{where}[{i}]", f"{v} is not a multiple of 8 (a handle is an aligned 8-byte word)")
        if out and v <= out[-1]:
            raise r.error(where, "must be sorted and distinct")
        out.append(v)
    return tuple(out)


def parse_textures(r: JsonReader, value: Any, where: str, arg_bytes: int) -> tuple[TextureObject, ...]:
    """An instance's ``textures`` list, checked: one entry per (kind, handle), no place named twice."""
    objects = tuple(TextureObject.parse(r, v, f"{where}[{i}]", arg_bytes) for i, v in enumerate(r.list(value, where)))
    seen: set[tuple[str, int]] = set()
    args: set[int] = set()
    memory: set[int] = set()
    for i, o in enumerate(objects):
        if (o.kind, o.handle) in seen:
            raise r.error(f"{where}[{i}]", f"{o.label} is listed twice")
        seen.add((o.kind, o.handle))
        if args & set(o.args) or memory & set(o.memory):
            raise r.error(f"{where}[{i}]", "a place that holds a handle is named by two objects")
        args.update(o.args)
        memory.update(o.memory)
    return objects
