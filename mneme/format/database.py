"""The recording database ``<static-hash>.json``: one static kernel and its recorded launches.

The database is the entry point of a recording: it names the kernel, its code
files, the device and address window it was recorded in, and one entry per
dynamic instance (launch shape, argument bytes, and the prologue/epilogue
snapshot files). Every file it names carries SHA-256 and size, checked on
read. It is written last, after everything it names is stored, and rewritten
atomically when new instances of the same kernel are added.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from mneme.errors import ArtifactError
from mneme.format.hashing import dynamic_hash
from mneme.format.layout import database_name, is_hash_id
from mneme.format.objects import ObjectRef
from mneme.format.schema import JsonReader
from mneme.format.textures import TextureObject, parse_textures
from mneme.model.experiment import MAX_BLOCK_DIM, MAX_GRID_DIM, Dim3
from mneme.store.base import Store

DATABASE_FORMAT = "mneme.recording"
DATABASE_VERSION = 1
PARAM_KINDS = ("pointer", "scalar", "bytes")
ADDRESS_MODES = ("fixed", "relocatable")
POINTER_SIZE = 8
#: CUDA limits the kernel parameter buffer to 32 764 bytes (CUDA 12.1+; 4 KiB before).
MAX_PARAM_BUFFER = 32764
_U64 = 2**64
_ARCH = re.compile(r"sm_[0-9]+[a-z]?")
_U32 = 2**32 - 1
_HEX = re.compile(r"(?:[0-9a-f]{2})*")

#: Name kept for the lead's API sketch: a code file reference is an ObjectRef.
CodeArtifact = ObjectRef


@dataclass(frozen=True)
class KernelParam:
    """One kernel parameter: its place in the parameter buffer and what it holds."""

    offset: int
    size: int
    kind: str = "bytes"

    def to_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "size": self.size, "kind": self.kind}


@dataclass(frozen=True)
class KernelSignature:
    """The kernel's name (mangled and readable) and its parameter layout."""

    name: str
    demangled: str = ""
    params: tuple[KernelParam, ...] = ()
    param_buffer_size: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "demangled": self.demangled,
            "params": [p.to_dict() for p in self.params],
            "param_buffer_size": self.param_buffer_size,
        }


@dataclass(frozen=True)
class KernelCode:
    """The kernel's code files: PTX (module text), cubin (module image as loaded), LLVM bitcode."""

    ptx: ObjectRef | None = None
    cubin: ObjectRef | None = None
    bitcode: ObjectRef | None = None
    arch: str = "sm_90"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ptx": None if self.ptx is None else self.ptx.to_dict(),
            "cubin": None if self.cubin is None else self.cubin.to_dict(),
            "bitcode": None if self.bitcode is None else self.bitcode.to_dict(),
            "arch": self.arch,
        }

    def refs(self) -> dict[str, ObjectRef]:
        """The code files present, by kind (``ptx``, ``cubin``, ``bitcode``)."""
        return {k: v for k, v in (("ptx", self.ptx), ("cubin", self.cubin), ("bitcode", self.bitcode)) if v}


@dataclass(frozen=True)
class DeviceInfo:
    """The GPU the launch was recorded on."""

    name: str = ""
    compute_capability: tuple[int, int] = (9, 0)
    ordinal: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "compute_capability": list(self.compute_capability), "ordinal": self.ordinal}


@dataclass(frozen=True)
class AddressSpace:
    """The recorder's allocation window: ``fixed`` replays at the same addresses, ``relocatable`` moves pointers."""

    mode: str = "fixed"
    base: int = 0
    size: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "base": self.base, "size": self.size}


@dataclass(frozen=True)
class RecorderInfo:
    """Who recorded: mneme version, host, MPI rank, when (ISO 8601 UTC), the command line."""

    version: str = ""
    host: str = ""
    rank: int | None = None
    created: str = ""
    command: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "host": self.host,
            "rank": self.rank,
            "created": self.created,
            "command": list(self.command),
        }


@dataclass(frozen=True)
class LaunchAttribute:
    """A launch attribute the application gave the launch (``cuLaunchKernelEx``; cooperative launches too).

    The recorder decodes the attributes it knows (``cluster_dim``: ``value``
    ``[x, y, z]``; ``cooperative``: ``[1]``) and keeps the driver's raw
    ``CUlaunchAttributeValue`` bytes of the others (``raw``); the replay
    decides which it can reproduce (``mneme.replay.launch_attrs``).
    """

    id: int
    name: str = ""
    value: tuple[int, ...] = ()
    raw: bytes = b""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "name": self.name}
        if self.raw:
            out["value_hex"] = self.raw.hex()
        else:
            out["value"] = list(self.value)
        return out

    @classmethod
    def parse(cls, r: JsonReader, value: Any, where: str) -> "LaunchAttribute":
        d = r.obj(value, where, required=("id", "name"), optional=("value", "value_hex"))
        attr_id = r.int(d["id"], f"{where}.id", 0, _U32)
        name = r.str(d["name"], f"{where}.name")
        values = tuple(r.int(v, f"{where}.value[{i}]", 0, _U32) for i, v in enumerate(r.list(d.get("value", []), f"{where}.value")))
        raw_hex = r.str(d.get("value_hex", ""), f"{where}.value_hex")
        if not _HEX.fullmatch(raw_hex):
            raise r.error(f"{where}.value_hex", "expected the attribute value as lowercase hex digit pairs")
        return cls(attr_id, name, values, bytes.fromhex(raw_hex))


def attributes_key(attributes: "tuple[LaunchAttribute, ...] | list[LaunchAttribute]") -> bytes:
    """The launch attributes as the dynamic hash takes them; empty for none.

    Per attribute, in the order given: u32le id, u32le length, then the value's
    bytes: the raw ones, or the decoded values as u32le each (which is how the
    driver lays out the decoded attributes: cluster dimensions, cooperative), so
    an attribute keeps its id whether a recorder decodes it or not.
    """
    out = b""
    for a in attributes:
        value = a.raw or struct.pack(f"<{len(a.value)}I", *a.value)
        out += struct.pack("<II", a.id, len(value)) + value
    return out


@dataclass(frozen=True)
class InstanceRecord:
    """One recorded launch (a dynamic instance) of the kernel."""

    dynamic_hash: str
    grid: Dim3
    block: Dim3
    shared_mem: int
    args: bytes
    prologue: ObjectRef
    epilogue: ObjectRef
    pointer_args: tuple[int, ...] = ()
    launch_index: int = 0
    occurrence: int = 0
    app_kernel_time_ns: int | None = None
    warnings: tuple[str, ...] = ()
    launch_attributes: tuple[LaunchAttribute, ...] = ()
    # Why the recorder could not capture this launch faithfully (memory it does not
    # snapshot, state it cannot restore); empty for a launch that replays. Replay and
    # tuning refuse an instance with reasons rather than run it into a CUDA fault.
    unsupported: tuple[str, ...] = ()
    # The texture and surface objects the launch reaches (mneme.format.textures): the replay recreates them
    # and writes their new handles where these say the kernel finds them.
    textures: tuple[TextureObject, ...] = ()

    @property
    def supported(self) -> bool:
        return not self.unsupported

    def to_dict(self) -> dict[str, Any]:
        """The JSON entry (the dynamic hash is its key in ``instances``, not a field)."""
        out = {
            "grid": self.grid.to_dict(),
            "block": self.block.to_dict(),
            "shared_mem": self.shared_mem,
            "args": self.args.hex(),
            "pointer_args": list(self.pointer_args),
            "prologue": self.prologue.to_dict(),
            "epilogue": self.epilogue.to_dict(),
            "launch_index": self.launch_index,
            "occurrence": self.occurrence,
            "app_kernel_time_ns": self.app_kernel_time_ns,
            "warnings": list(self.warnings),
        }
        if self.launch_attributes:  # only then: older readers still read recordings of plain launches
            out["launch_attributes"] = [a.to_dict() for a in self.launch_attributes]
        if self.unsupported:  # likewise: written only for a launch that cannot be replayed
            out["supported"] = False
            out["unsupported"] = list(self.unsupported)
        if self.textures:  # likewise: only for a launch that reaches texture or surface objects
            out["textures"] = [t.to_dict() for t in self.textures]
        return out


@dataclass(frozen=True)
class RecordingDatabase:
    """Everything ``<static>.json`` holds.

    Attributes:
        static_hash: the kernel's static hash (the database's name).
        kernel: the kernel's signature: name and parameter layout.
        code: the kernel's stored code files.
        device: the GPU it was recorded on.
        address_space: where the recorded memory lay (``fixed`` window or ``relocatable``).
        recorder: what recorded it.
        instances: the recorded launches by dynamic hash.
    """

    static_hash: str
    kernel: KernelSignature
    code: KernelCode
    device: DeviceInfo = field(default_factory=DeviceInfo)
    address_space: AddressSpace = field(default_factory=AddressSpace)
    recorder: RecorderInfo = field(default_factory=RecorderInfo)
    instances: Mapping[str, InstanceRecord] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The database's object name, ``<static>.json``."""
        return database_name(self.static_hash)

    def to_dict(self) -> dict[str, Any]:
        """The database as JSON types, with its checksum; instances in launch order.

        Returns:
            A new dict.
        """
        ordered = sorted(self.instances.values(), key=lambda i: (i.launch_index, i.dynamic_hash))
        out: dict[str, Any] = {
            "format": DATABASE_FORMAT,
            "format_version": DATABASE_VERSION,
            "static_hash": self.static_hash,
            "kernel": self.kernel.to_dict(),
            "code": self.code.to_dict(),
            "device": self.device.to_dict(),
            "address_space": self.address_space.to_dict(),
            "recorder": self.recorder.to_dict(),
            "instances": {i.dynamic_hash: i.to_dict() for i in ordered},
        }
        out["checksum"] = content_checksum(out)
        return out

    @classmethod
    def from_dict(cls, data: Any, what: str = "recording database") -> "RecordingDatabase":
        """Parse and validate; every problem is an ArtifactError naming ``what`` and the field.

        Args:
            data: the parsed JSON.
            what: what it is, for error messages.

        Returns:
            The database.

        Raises:
            ArtifactError: a missing or wrong field, an unknown version, or a checksum that does not match.
        """
        return _parse_database(JsonReader(what), data)

    def to_json(self) -> str:
        """The file's text: ``to_dict`` as indented JSON.

        Returns:
            The JSON text, ending in a newline.
        """
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def validate(self) -> None:
        """Raise ArtifactError if this database would not read back."""
        RecordingDatabase.from_dict(json.loads(self.to_json()), self.name)

    def add_instance(self, instance: InstanceRecord) -> "RecordingDatabase":
        """A copy with ``instance`` added (replacing an entry of the same dynamic hash).

        Args:
            instance: the instance's record.

        Returns:
            The new database.
        """
        instances = dict(self.instances)
        instances[instance.dynamic_hash] = instance
        return replace(self, instances=instances)

    def referenced_objects(self) -> list[ObjectRef]:
        """Every file this database names (code files, then each instance's snapshots).

        Returns:
            The references, in that order.
        """
        refs = list(self.code.refs().values())
        for inst in self.instances.values():
            refs += [inst.prologue, inst.epilogue]
        return refs


# -- parsing ---------------------------------------------------------------------


def _parse_database(r: JsonReader, data: Any) -> RecordingDatabase:
    if isinstance(data, dict) and isinstance(data.get("format_version"), int):
        version = data["format_version"]
        if version > DATABASE_VERSION:
            raise r.error(
                "format_version",
                f"recording format version {version} is newer than this mneme reads (up to {DATABASE_VERSION}); "
                "upgrade mneme",
            )
    d = r.obj(
        data,
        "",
        required=(
            "format", "format_version", "static_hash", "kernel", "code",
            "device", "address_space", "recorder", "instances",
        ),
        optional=("checksum",),
    )  # fmt: skip
    if d["format"] != DATABASE_FORMAT:
        raise r.error("format", f"expected {DATABASE_FORMAT!r}, got {d['format']!r}; this is not a mneme recording")
    r.int(d["format_version"], "format_version", 1, DATABASE_VERSION)
    static = r.str(d["static_hash"], "static_hash")
    if not is_hash_id(static):
        raise r.error("static_hash", f"{static!r} is not a hash id (a decimal unsigned 64-bit integer)")
    kernel = _parse_kernel(r, d["kernel"])
    code = _parse_code(r, d["code"])
    device = _parse_device(r, d["device"])
    address_space = _parse_address_space(r, d["address_space"])
    recorder = _parse_recorder(r, d["recorder"])
    instances_value = r.mapping(d["instances"], "instances")
    instances = {}
    for key, value in instances_value.items():
        instances[key] = _parse_instance(r, static, kernel, key, value)
    if "checksum" in d:
        # Checked last, so that a schema problem is reported by field, not as a bare mismatch.
        recorded = r.str(d["checksum"], "checksum")
        if recorded != content_checksum(d):
            raise r.error(
                "checksum",
                "the content does not match its checksum; the file is corrupt or was edited "
                "(after an intended edit, remove the checksum key or re-save with mneme.format.database.save_database)",
            )
    return RecordingDatabase(static, kernel, code, device, address_space, recorder, instances)


def content_checksum(data: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of the canonical JSON (sorted keys, no spaces) of everything but ``checksum``.

    Covers the values, not the layout: re-indenting the file keeps it valid;
    changing any value (a window base, a pointer offset) is detected.
    """
    body = {k: v for k, v in data.items() if k != "checksum"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _parse_kernel(r: JsonReader, value: Any) -> KernelSignature:
    d = r.obj(value, "kernel", required=("name", "demangled", "params", "param_buffer_size"))
    name = r.str(d["name"], "kernel.name", nonempty=True)
    demangled = r.str(d["demangled"], "kernel.demangled")
    buffer_size = r.int(d["param_buffer_size"], "kernel.param_buffer_size", 0, MAX_PARAM_BUFFER)
    params = []
    end = 0
    for i, p in enumerate(r.list(d["params"], "kernel.params")):
        where = f"kernel.params[{i}]"
        pd = r.obj(p, where, required=("offset", "size", "kind"))
        offset = r.int(pd["offset"], f"{where}.offset", 0, buffer_size)
        size = r.int(pd["size"], f"{where}.size", 1, buffer_size)
        kind = r.choice(pd["kind"], f"{where}.kind", PARAM_KINDS)
        if offset < end:
            raise r.error(where, f"offset {offset} overlaps the previous parameter (parameters are sorted by offset)")
        if offset + size > buffer_size:
            raise r.error(where, f"ends at {offset + size}, past the parameter buffer size {buffer_size}")
        if kind == "pointer" and size != POINTER_SIZE:
            raise r.error(where, f"a pointer parameter has {POINTER_SIZE} bytes, not {size}")
        end = offset + size
        params.append(KernelParam(offset, size, kind))
    return KernelSignature(name, demangled, tuple(params), buffer_size)


def _parse_code(r: JsonReader, value: Any) -> KernelCode:
    d = r.obj(value, "code", required=("ptx", "cubin", "bitcode", "arch"))
    refs = {}
    for kind in ("ptx", "cubin", "bitcode"):
        refs[kind] = None if d[kind] is None else ObjectRef.parse(r, d[kind], f"code.{kind}")
    if refs["ptx"] is None and refs["cubin"] is None:
        raise r.error("code", "neither PTX nor cubin recorded; the kernel cannot be loaded")
    arch = r.str(d["arch"], "code.arch")
    if not _ARCH.fullmatch(arch):
        raise r.error("code.arch", f"{arch!r} is not a GPU architecture like 'sm_90'")
    return KernelCode(refs["ptx"], refs["cubin"], refs["bitcode"], arch)


def _parse_device(r: JsonReader, value: Any) -> DeviceInfo:
    d = r.obj(value, "device", required=("name", "compute_capability", "ordinal"))
    cc = r.list(d["compute_capability"], "device.compute_capability")
    if len(cc) != 2:
        raise r.error("device.compute_capability", "expected [major, minor]")
    major = r.int(cc[0], "device.compute_capability[0]", 0, 1000)
    minor = r.int(cc[1], "device.compute_capability[1]", 0, 1000)
    return DeviceInfo(r.str(d["name"], "device.name"), (major, minor), r.int(d["ordinal"], "device.ordinal", 0))


def _parse_address_space(r: JsonReader, value: Any) -> AddressSpace:
    d = r.obj(value, "address_space", required=("mode", "base", "size"))
    mode = r.choice(d["mode"], "address_space.mode", ADDRESS_MODES)
    base = r.int(d["base"], "address_space.base", 0, _U64 - 1)
    size = r.int(d["size"], "address_space.size", 0, _U64 - 1)
    if base + size > _U64:
        raise r.error("address_space", "the window passes the end of the 64-bit address space")
    return AddressSpace(mode, base, size)


def _parse_recorder(r: JsonReader, value: Any) -> RecorderInfo:
    d = r.obj(value, "recorder", required=("version", "host", "rank", "created", "command"))
    command = tuple(r.str(a, f"recorder.command[{i}]") for i, a in enumerate(r.list(d["command"], "recorder.command")))
    return RecorderInfo(
        r.str(d["version"], "recorder.version"),
        r.str(d["host"], "recorder.host"),
        r.optional_int(d["rank"], "recorder.rank", 0),
        r.str(d["created"], "recorder.created"),
        command,
    )


def _parse_dim3(r: JsonReader, value: Any, where: str, limits: tuple[int, int, int]) -> Dim3:
    d = r.obj(value, where, required=("x", "y", "z"))
    return Dim3(*(r.int(d[a], f"{where}.{a}", 1, limit) for a, limit in zip("xyz", limits)))


def _parse_instance(
    r: JsonReader, static: str, kernel: KernelSignature, key: str, value: Any
) -> InstanceRecord:
    where = f"instances.{key}"
    if not is_hash_id(key):
        raise r.error(where, f"{key!r} is not a dynamic hash id (a decimal unsigned 64-bit integer)")
    d = r.obj(
        value,
        where,
        required=(
            "grid", "block", "shared_mem", "args", "pointer_args", "prologue", "epilogue",
            "launch_index", "occurrence", "app_kernel_time_ns", "warnings",
        ),
        optional=("launch_attributes", "supported", "unsupported", "textures"),
    )  # fmt: skip
    grid = _parse_dim3(r, d["grid"], f"{where}.grid", MAX_GRID_DIM)
    block = _parse_dim3(r, d["block"], f"{where}.block", MAX_BLOCK_DIM)
    shared_mem = r.int(d["shared_mem"], f"{where}.shared_mem", 0, _U32)
    args_hex = r.str(d["args"], f"{where}.args")
    if not _HEX.fullmatch(args_hex):
        raise r.error(f"{where}.args", "expected the parameter buffer as a string of lowercase hex digit pairs")
    args = bytes.fromhex(args_hex)
    if len(args) != kernel.param_buffer_size:
        raise r.error(
            f"{where}.args",
            f"{len(args)} bytes, the kernel's parameter buffer has {kernel.param_buffer_size}",
        )
    pointer_args = []
    for i, off in enumerate(r.list(d["pointer_args"], f"{where}.pointer_args")):
        off = r.int(off, f"{where}.pointer_args[{i}]", 0, max(len(args) - POINTER_SIZE, 0))
        if off + POINTER_SIZE > len(args):
            raise r.error(f"{where}.pointer_args[{i}]", f"a pointer at offset {off} passes the {len(args)}-byte buffer")
        if pointer_args and off <= pointer_args[-1]:
            raise r.error(f"{where}.pointer_args", "offsets must be sorted and distinct")
        pointer_args.append(off)
    prologue = ObjectRef.parse(r, d["prologue"], f"{where}.prologue")
    epilogue = ObjectRef.parse(r, d["epilogue"], f"{where}.epilogue")
    launch_index = r.int(d["launch_index"], f"{where}.launch_index", 0)
    occurrence = r.int(d["occurrence"], f"{where}.occurrence", 0, _U32)
    kernel_time = r.optional_int(d["app_kernel_time_ns"], f"{where}.app_kernel_time_ns", 0)
    warnings = tuple(r.str(w, f"{where}.warnings[{i}]") for i, w in enumerate(r.list(d["warnings"], f"{where}.warnings")))
    attributes = tuple(
        LaunchAttribute.parse(r, a, f"{where}.launch_attributes[{i}]")
        for i, a in enumerate(r.list(d.get("launch_attributes", []), f"{where}.launch_attributes"))
    )
    unsupported = tuple(
        r.str(w, f"{where}.unsupported[{i}]") for i, w in enumerate(r.list(d.get("unsupported", []), f"{where}.unsupported"))
    )
    textures = parse_textures(r, d.get("textures", []), f"{where}.textures", len(args))
    supported = d.get("supported", True)
    if not isinstance(supported, bool) or supported != (not unsupported):
        raise r.error(f"{where}.supported", "must be false exactly when the instance lists reasons in 'unsupported'")
    expected = dynamic_hash(static, grid, block, shared_mem, args, occurrence, attributes_key(attributes))
    if expected != key:
        raise r.error(
            where,
            f"the launch it describes (grid, block, shared_mem, args, launch attributes, occurrence) has dynamic "
            f"hash {expected}, "
            "not its id; the entry is corrupt or was edited",
        )
    return InstanceRecord(
        key, grid, block, shared_mem, args, prologue, epilogue,
        tuple(pointer_args), launch_index, occurrence, kernel_time, warnings, attributes, unsupported, textures,
    )  # fmt: skip


# -- store access ---------------------------------------------------------------


def parse_database_bytes(data: bytes, what: str) -> RecordingDatabase:
    """Parse database file bytes; every problem is an ArtifactError naming ``what``."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ArtifactError(f"{what}: not valid UTF-8 JSON ({exc}); the file is corrupt or truncated") from None
    except RecursionError:
        raise ArtifactError(f"{what}: JSON nested too deeply; the file is corrupt") from None
    return RecordingDatabase.from_dict(value, what)


DATABASE_NAME = re.compile(r"[0-9]{1,20}\.json")


def find_databases(store: Store) -> list[str]:
    """The recording databases (``<static>.json``) at the top of ``store``, sorted.

    Lists by leading digit so that the ``chunks/`` tree is never walked.

    Args:
        store: the store.

    Returns:
        The databases' object names.
    """
    return sorted(n for digit in "0123456789" for n in store.list(digit) if DATABASE_NAME.fullmatch(n))


def load_database(store: Store, name: str) -> RecordingDatabase:
    """Read and validate database ``name`` (``<static>.json``) from ``store``.

    Args:
        store: the store.
        name: the database's object name.

    Returns:
        The ``RecordingDatabase``.

    Raises:
        ArtifactError: missing, not JSON, or not a valid database.
    """
    what = f"{name} in {store.url}"
    db = parse_database_bytes(store.get(name), what)
    basename = name.rpartition("/")[2]
    if DATABASE_NAME.fullmatch(basename) and basename != db.name:
        raise ArtifactError(f"{what}: holds kernel {db.static_hash}, but its name says {basename[:-5]}; it was renamed")
    return db


def save_database(store: Store, db: RecordingDatabase, name: str | None = None) -> str:
    """Validate and write the database (pretty JSON), atomically; return its object name.

    Args:
        store: the store.
        db: the database.
        name: its object name (default: ``<static>.json``).

    Returns:
        The object name.
    """
    db.validate()
    target = name or db.name
    store.put(target, db.to_json().encode("utf-8"))
    return target


def merge_databases(existing: RecordingDatabase, new: RecordingDatabase) -> RecordingDatabase:
    """``existing`` plus the instances of ``new`` (new entries win: their snapshot files replaced the old ones).

    Both must describe the same kernel with the same code; otherwise the
    directory would mix recordings of different builds.

    Args:
        existing: the database already stored.
        new: the database of this recording.

    Returns:
        A new database with both instances.

    Raises:
        ArtifactError: they describe different kernels or code.
    """
    if existing.static_hash != new.static_hash:
        raise ArtifactError(f"cannot merge databases of kernels {existing.static_hash} and {new.static_hash}")
    if existing.kernel != new.kernel:
        raise ArtifactError(
            f"{existing.name}: kernel {new.kernel.name} is recorded there with a different signature; "
            "record into a fresh directory"
        )
    if existing.code != new.code:
        raise ArtifactError(
            f"{existing.name}: kernel {new.kernel.name} is recorded there with different code files "
            "(same PTX, a different cubin or bitcode?); record into a fresh directory"
        )
    instances = dict(existing.instances)
    instances.update(new.instances)
    return replace(existing, instances=instances)
