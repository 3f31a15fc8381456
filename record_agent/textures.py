"""Texture and surface objects of a recorded launch: which the kernel reaches, and where it finds their handles.

The recorder lists every texture and surface object alive at a recorded launch
with its descriptors (launch.json ``objects``) and captures the CUDA arrays
behind them (regions of kind ``array``). A handle is an opaque 64-bit value,
possibly a small number, so a word that equals one may well be data; the replay
writes new handles only where this module *confirms* the kernel reads one:

* With the kernel's PTX (the usual case): every ``tex``, ``tld4``, ``txq``,
  ``suld``, ``sust``, ``sured`` and ``suq`` instruction of the kernel (its
  ``.entry`` and the ``.func`` it calls) names its handle in a register; the
  register's definitions are followed back (``mov``, ``selp``) to a load of
  the parameter buffer (``ld.param`` of the entry's parameter at a known byte:
  that argument word holds a handle, confirmed) or to a load from memory (the
  kernel reads handles from memory). The argument words the PTX names must
  hold live handles of the instruction's kind. When handles come from memory,
  the prologue of every captured heap and global region is scanned for
  8-byte-aligned words equal to a live handle of that kind; each is taken as a
  handle (a data word that happens to equal one is rewritten too: at most
  ``MAX_MEMORY_SITES`` are, the instance says how many, and a wrong one shows
  as a failed verification, not as a silent pass). A handle the PTX cannot
  follow (passed to a function that is not inlined, a texture reference)
  makes the launch unsupported, by name.
* Without PTX (SASS-only kernels): 8-byte parameters that equal a live handle
  are taken as handles, and the instance warns that they were guessed;
  handles stored in memory are not looked for.

Objects no confirmed place names are left out (and their arrays are not
stored). A confirmed object is captured when its resource is a CUDA array the
recorder copied or linear or pitched memory inside one captured heap region;
otherwise (a mipmapped array, a layered or cubemap array, an array the recorder
did not see created, memory it did not capture) the launch is unsupported with
the reason.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

from mneme.errors import ArtifactError
from mneme.format.schema import JsonReader
from mneme.format.textures import Resource, TextureDesc, TextureObject, ViewDesc
from record_agent.spool import SpoolEntry, SpoolRegion
from record_agent.support import param_name

HANDLE_SIZE = 8
#: More words of captured memory than this equal to live handles: mneme cannot tell handles from data.
MAX_MEMORY_SITES = 1024

_TEXTURE_OPS = ("tex", "tld4", "txq")
_SURFACE_OPS = ("suld", "sust", "sured", "suq")
_INSTRUCTION = re.compile(r"^(?:@!?%\w+\s+)?([a-z][\w.]*)\s*(.*)$", re.DOTALL)
_FUNCTION = re.compile(r"\.(entry|func)\s+(?:\([^)]*\)\s*)?([\w$.]+)\s*\(", re.MULTILINE)
_CALL = re.compile(r"\bcall(?:\.uni)?\s+(?:\([^)]*\)\s*,\s*)?([\w$.]+)")
_BRACE = re.compile(r"[{}]")
_PARAM = re.compile(r"\[\s*([\w$.]+?)_param_(\d+)\s*(?:\+\s*(\d+))?\s*\]")


# -- the kernel's code -----------------------------------------------------------------------------------


@dataclass
class HandleUse:
    """Where the handles of one kind of instruction (texture or surface) come from."""

    args: set[int] = field(default_factory=set)  # byte offsets in the parameter buffer
    memory: bool = False  # loaded from memory
    untraced: list[str] = field(default_factory=list)  # instructions whose handle could not be followed
    instructions: int = 0

    @property
    def reads(self) -> bool:
        return self.instructions > 0


@dataclass
class PtxHandles:
    """What the kernel's PTX says of the handles its texture and surface instructions use."""

    texture: HandleUse = field(default_factory=HandleUse)
    surface: HandleUse = field(default_factory=HandleUse)

    def of(self, kind: str) -> HandleUse:
        return self.texture if kind == "texture" else self.surface

    @property
    def reads(self) -> bool:
        return self.texture.reads or self.surface.reads


def _functions(ptx: str) -> dict[str, tuple[str, str, str]]:
    """name -> (``entry`` or ``func``, parameter list text, body) of every function defined in ``ptx``."""
    out = {}
    for m in _FUNCTION.finditer(ptx):
        close = ptx.find(")", m.end())  # a parameter list holds no parentheses
        start, semicolon = ptx.find("{", close), ptx.find(";", close)
        if close < 0 or start < 0 or 0 <= semicolon < start:  # a declaration (.extern .func ...;), no body
            continue
        depth = 0
        for brace in _BRACE.finditer(ptx, start):
            depth += 1 if brace.group() == "{" else -1
            if depth == 0:
                out[m.group(2)] = (m.group(1), ptx[m.end() : close], ptx[start + 1 : brace.start()])
                break
    return out


def _statements(body: str) -> list[str]:
    body = re.sub(r"//[^\n]*", "", body)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.DOTALL)
    # Debug directives (.loc, .file) and labels end with a line, not a semicolon.
    body = re.sub(r"^\s*(?:\.(?:loc|file|section)\b[^\n]*|[\w$]+:)\s*$", "", body, flags=re.MULTILINE)
    out = []
    for s in body.split(";"):
        s = " ".join(s.split())
        while s.startswith("{") or s.startswith("}"):
            s = s[1:].strip()
        if s.endswith(":") or not s:
            continue
        s = re.sub(r"^[\w$]+:\s*", "", s)  # a label before the instruction
        if s and not s.startswith("."):
            out.append(s)
    return out


def _operands(text: str) -> list[str]:
    """Top-level comma-separated operands ({...} and [...] kept whole)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _destinations(operand: str) -> list[str]:
    """The registers an instruction's first operand writes (``%rd1``, ``{%rd1, %rd2}``, ``%rd1|%p1``)."""
    operand = operand.split("|")[0].strip()
    if operand.startswith("{"):
        return [r.strip() for r in operand.strip("{}").split(",")]
    return [operand]


class _Function:
    """One function's instructions: who sets each register, and the calls it makes with what arguments."""

    def __init__(self, name: str, kind: str, body: str):
        self.name, self.kind = name, kind
        self.statements = [_INSTRUCTION.match(s) for s in _statements(body)]
        self.defs: dict[str, list[tuple[str, list[str], int]]] = {}  # register -> (opcode, operands, index)
        self.calls: list[tuple[str, list[str], dict[tuple[str, int], str]]] = []  # (callee, args, stored values)
        stored: dict[tuple[str, int], str] = {}  # (parameter, byte) -> the register stored there for the next call
        for m in self.statements:
            if not m:
                continue
            opcode, ops = m.group(1), _operands(m.group(2))
            op = opcode.split(".")[0]
            if op == "st" and "param" in opcode.split(".") and len(ops) == 2:
                target = re.fullmatch(r"\[\s*([\w$.]+)\s*(?:\+\s*(\d+))?\s*\]", ops[0])
                if target:
                    stored[(target.group(1), int(target.group(2) or 0))] = ops[1]
                continue
            if op == "call":
                callee = _CALL.search(m.group(0))
                args = re.search(r",\s*\(([^)]*)\)\s*$", m.group(2))
                if callee:
                    names = [a.strip() for a in args.group(1).split(",")] if args else []
                    self.calls.append((callee.group(1), names, dict(stored)))
                stored = {}
                continue
            if not ops or op in ("st", "bra", "ret", "exit", "bar", "membar", "red", "sust", "sured"):
                continue
            for i, reg in enumerate(_destinations(ops[0])):
                if reg.startswith("%"):
                    self.defs.setdefault(reg, []).append((opcode, ops, i))


class _Tracer:
    """Follows handle registers back through the functions of a module, across calls."""

    def __init__(self, functions: dict[str, _Function], param_offsets: tuple[int, ...]):
        self.functions, self.param_offsets = functions, param_offsets

    def trace(self, fn: _Function, register: str, use: HandleUse, where: str, seen: set | None = None) -> None:
        """Follow ``register`` of ``fn`` to loads of the kernel's parameters or of memory (``use`` gets them)."""
        seen = set() if seen is None else seen
        if (fn.name, register) in seen:
            return
        seen.add((fn.name, register))
        defs = fn.defs.get(register)
        if not defs:
            use.untraced.append(f"{where} (its handle {register} is never set)")
            return
        for opcode, ops, index in defs:
            parts = opcode.split(".")
            if parts[0] == "ld" and "param" in parts:
                m = _PARAM.search(ops[1]) if len(ops) > 1 else None
                if not m or m.group(1) != fn.name:
                    use.untraced.append(f"{where} (its handle is read from {ops[1] if len(ops) > 1 else 'a parameter'})")
                    continue
                k, offset = int(m.group(2)), int(m.group(3) or 0) + HANDLE_SIZE * index
                if fn.kind == "entry":
                    if k < len(self.param_offsets):
                        use.args.add(self.param_offsets[k] + offset)
                    else:
                        use.untraced.append(f"{where} (its handle is read from parameter {k}, which the launch lacks)")
                else:
                    self._callers(fn, k, offset, use, where, seen)
            elif parts[0] in ("ld", "ldu"):
                use.memory = True
            elif parts[0] == "mov" and len(ops) == 2 and ops[1].startswith("%"):
                self.trace(fn, ops[1], use, where, seen)
            elif parts[0] == "selp" and len(ops) == 4:
                for source in ops[1:3]:
                    if source.startswith("%"):
                        self.trace(fn, source, use, where, seen)
                    else:
                        use.untraced.append(f"{where} (a handle chosen from a constant)")
            else:
                use.untraced.append(f"{where} (its handle comes from {opcode})")

    def _callers(self, fn: _Function, k: int, offset: int, use: HandleUse, where: str, seen: set) -> None:
        """A handle that is parameter ``k`` of the function ``fn``: what each call of ``fn`` passes there."""
        found = False
        for caller in self.functions.values():
            for callee, args, stored in caller.calls:
                if callee != fn.name:
                    continue
                found = True
                value = stored.get((args[k], offset)) if k < len(args) else None
                if value is None or not value.startswith("%"):
                    use.untraced.append(f"{where} (a handle passed to {fn.name} that mneme cannot follow)")
                else:
                    self.trace(caller, value, use, where, seen)
        if not found:
            use.untraced.append(f"{where} (a handle passed to {fn.name}, which nothing here calls)")


def ptx_handles(ptx: str, kernel: str, param_offsets: Iterable[int]) -> PtxHandles:
    """Where the texture and surface instructions of ``kernel`` (and the functions it calls) find their handles.

    Read once per (PTX, kernel, layout): the launches of a kernel ask again.
    """
    return _ptx_handles(ptx, kernel, tuple(param_offsets))


@functools.lru_cache(maxsize=32)
def _ptx_handles(ptx: str, kernel: str, param_offsets: tuple[int, ...]) -> PtxHandles:
    texts = _functions(ptx)
    out = PtxHandles()
    if kernel not in texts:  # the kernel is not in this PTX: read every function
        reachable = list(texts)
    else:
        reachable, todo = [kernel], [kernel]
        while todo:
            for callee in _CALL.findall(texts[todo.pop()][2]):
                if callee in texts and callee not in reachable:
                    reachable.append(callee)
                    todo.append(callee)
    functions = {name: _Function(name, texts[name][0], texts[name][2]) for name in reachable}
    tracer = _Tracer(functions, param_offsets)
    for fn in functions.values():
        for m in fn.statements:
            if not m:
                continue
            op = m.group(1).split(".")[0]
            if op not in _TEXTURE_OPS and op not in _SURFACE_OPS:
                continue
            use = out.texture if op in _TEXTURE_OPS else out.surface
            use.instructions += 1
            where = f"{m.group(1)} in {fn.name}"
            bracket = re.search(r"\[\s*([^,\]\s]+)", m.group(2))
            handle = bracket.group(1) if bracket else ""
            if handle.startswith("%"):
                tracer.trace(fn, handle, use, where)
            else:
                use.untraced.append(f"{where} (reads {handle or 'no handle'}: a texture or surface reference?)")
    return out


# -- the plan for one entry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TexturePlan:
    """What the recording keeps of an entry's texture and surface objects.

    Attributes:
        records: the confirmed objects, with their descriptors and the places of their handles.
        arrays: bases (recorded array handles) of the array regions those objects read: the only ones stored.
        unsupported: why the launch cannot be replayed because of its objects (then ``records`` is empty).
        warnings: what the instance should say (handles guessed without PTX, handles taken from memory).
    """

    records: tuple[TextureObject, ...] = ()
    arrays: frozenset[int] = frozenset()
    unsupported: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def stored(self, entry: SpoolEntry) -> SpoolEntry:
        """The entry with only the array regions the recording keeps (those its objects read)."""
        regions = tuple(r for r in entry.regions if r.kind != "array" or r.base in self.arrays)
        return entry if len(regions) == len(entry.regions) else replace(entry, regions=regions)


def _word(data: bytes, offset: int) -> int | None:
    if offset < 0 or offset + HANDLE_SIZE > len(data):
        return None
    return int.from_bytes(data[offset : offset + HANDLE_SIZE], "little")


def scan_words(data: bytes, base: int, handles: set[int], limit: int) -> list[tuple[int, int]]:
    """(address, value) of the 8-byte-aligned words (by device address) of ``data`` at ``base`` that are in
    ``handles``; at most ``limit`` + 1."""
    import numpy as np

    if not handles or len(data) < HANDLE_SIZE:
        return []
    skip = (-base) % HANDLE_SIZE
    count = (len(data) - skip) // HANDLE_SIZE
    if count <= 0:
        return []
    words = np.frombuffer(data, dtype="<u8", count=count, offset=skip)
    hits = np.nonzero(np.isin(words, np.array(sorted(handles), dtype="<u8")))[0][: limit + 1]
    return [(base + skip + HANDLE_SIZE * int(i), int(words[i])) for i in hits]


class _Sites:
    """The places each (kind, handle) is read from."""

    def __init__(self) -> None:
        self.args: dict[tuple[str, int], list[int]] = {}
        self.memory: dict[tuple[str, int], list[int]] = {}

    def add(self, table: dict, kind: str, handle: int, place: int) -> None:
        table.setdefault((kind, handle), []).append(place)

    def objects(self) -> list[tuple[str, int]]:
        return sorted(set(self.args) | set(self.memory))


def plan_textures(
    entry: SpoolEntry, ptx: str | None, prologue_bytes: Callable[[SpoolRegion], bytes] | None = None
) -> TexturePlan:
    """Which of the entry's live objects the launch reaches, confirmed, and what the recording keeps of them.

    Args:
        entry: the spool entry.
        ptx: the module's PTX (None: the kernel was recorded without it).
        prologue_bytes: the prologue bytes of a captured region (for handles the kernel loads from memory).

    Returns:
        The plan.
    """
    live = {"texture": {}, "surface": {}}
    for o in entry.objects:
        live[o.kind][o.handle] = o
    if not live["texture"] and not live["surface"]:
        return TexturePlan()
    reasons: list[str] = []
    warnings: list[str] = []
    sites = _Sites()
    memory_kinds: set[str] = set()
    if ptx is not None:
        uses = ptx_handles(ptx, entry.kernel, entry.param_offsets)
        if not uses.reads:
            return TexturePlan()
        for kind in ("texture", "surface"):
            use = uses.of(kind)
            for what in use.untraced[:1]:
                reasons.append(f"the kernel reads {kind} objects through handles mneme cannot follow to its "
                               f"arguments or to memory: {what}")  # fmt: skip
            for offset in sorted(use.args):
                value = _word(entry.args, offset)
                if value == 0:  # no object: the kernel does not read it here (or reads nothing, as recorded)
                    continue
                if value is None or value not in live[kind]:
                    shown = "nothing" if value is None else f"{value:#x}"
                    reasons.append(f"{param_name(entry, offset)} is read as a {kind} object but holds {shown}, "
                                   f"no {kind} object alive at the launch")  # fmt: skip
                    continue
                sites.add(sites.args, kind, value, offset)
            if use.memory:
                memory_kinds.add(kind)
    else:
        for i, (offset, size) in enumerate(zip(entry.param_offsets, entry.param_sizes)):
            value = _word(entry.args, offset) if size == HANDLE_SIZE else None
            kinds = [k for k in ("texture", "surface") if value is not None and value in live[k]]
            if len(kinds) == 2:
                reasons.append(f"argument {i} holds {value:#x}, the handle of a live texture object and of a live "
                               "surface object, and without the kernel's PTX mneme cannot tell which it reads")
            elif kinds:
                sites.add(sites.args, kinds[0], value, offset)  # type: ignore[arg-type]
    if memory_kinds and prologue_bytes is not None:
        _memory_sites(entry, live, memory_kinds, prologue_bytes, sites, reasons, warnings)
    if ptx is None and sites.args:
        warnings.append(f"without the kernel's PTX, {sum(map(len, sites.args.values()))} 8-byte argument(s) equal to "
                        "live texture or surface handles are taken as handles (handles in memory are not looked for)")
    records, arrays = [], set()
    for kind, handle in sites.objects():
        record, why = _record(entry, live[kind][handle], tuple(sorted(sites.args.get((kind, handle), ()))),
                              tuple(sorted(sites.memory.get((kind, handle), ()))))  # fmt: skip
        if why:
            reasons.append(why)
        else:
            records.append(record)
            if record.resource.type == "array":
                arrays.add(record.resource.array)
    if reasons:
        return TexturePlan(unsupported=tuple(dict.fromkeys(reasons)), warnings=tuple(warnings))
    return TexturePlan(tuple(records), frozenset(arrays), (), tuple(warnings))


def _memory_sites(entry: SpoolEntry, live: dict, kinds: set[str], prologue_bytes: Callable[[SpoolRegion], bytes],
                  sites: _Sites, reasons: list[str], warnings: list[str]) -> None:  # fmt: skip
    """Words of captured memory equal to live handles of ``kinds``, whose handles the kernel's PTX loads from memory."""
    handles = {h for k in kinds for h in live[k]}
    found = 0
    for region in entry.regions:
        if region.kind not in ("heap", "global"):
            continue
        for address, value in scan_words(prologue_bytes(region), region.base, handles, MAX_MEMORY_SITES - found):
            matching = [k for k in sorted(kinds) if value in live[k]]
            if len(matching) == 2:
                reasons.append(f"the word at {address:#x} holds {value:#x}, the handle of a live texture object and "
                               "of a live surface object, and the kernel loads both kinds from memory")  # fmt: skip
                return
            sites.add(sites.memory, matching[0], value, address)
            found += 1
            if found > MAX_MEMORY_SITES:
                reasons.append(f"more than {MAX_MEMORY_SITES} words of captured memory equal live texture or surface "
                               "handles: mneme cannot tell the handles the kernel loads from data")  # fmt: skip
                return
    for kind in sorted(kinds):
        if not any(k == kind for k, _ in sites.memory):
            reasons.append(f"the kernel loads {kind} handles from memory, and the captured memory holds none of the "
                           f"{len(live[kind])} {kind} object(s) alive at the launch")  # fmt: skip
    if found:
        warnings.append(f"the kernel loads texture or surface handles from memory: {found} word(s) of captured memory "
                        "equal to live handles are taken as handles, and the replay writes its own handles there")


def _record(entry: SpoolEntry, obj: Any, args: tuple[int, ...], memory: tuple[int, ...]) -> tuple[Any, str]:
    """(the object's TextureObject, '') or (None, why it cannot be captured)."""
    label = f"{obj.kind} object {obj.handle:#x}"
    if obj.unsupported:
        return None, f"the kernel reads {label}, which is not captured: {obj.unsupported}"
    r = JsonReader(f"spool entry {entry.path}: {label}")
    try:
        resource = Resource.parse(r, obj.resource, "resource")
        texture = None if obj.texture is None else TextureDesc.parse(r, obj.texture, "texture")
        view = None if obj.view is None else ViewDesc.parse(r, obj.view, "view")
        record = TextureObject(obj.kind, obj.handle, resource, texture, view, args, memory)
    except ArtifactError as exc:
        return None, f"the kernel reads {label}, which is not captured: {exc}"
    if resource.type == "array":
        if not any(reg.kind == "array" and reg.base == resource.array for reg in entry.regions):
            return None, f"the kernel reads {label}, whose CUDA array {resource.array:#x} the recorder did not copy"
        return record, ""
    end = resource.address + resource.extent
    if not any(reg.kind == "heap" and reg.base <= resource.address and end <= reg.base + reg.size
               for reg in entry.regions):  # fmt: skip
        return None, (f"the kernel reads {label}, over {resource.extent} bytes at {resource.address:#x}, which lie in "
                      "no captured heap allocation")  # fmt: skip
    return record, ""


# -- reading an entry's prologue ---------------------------------------------------------------------------


def region_bytes(entry: SpoolEntry, region: SpoolRegion, phase: str,
                 earlier: Callable[[str, int], bytes | None]) -> bytes:  # fmt: skip
    """A region's bytes in ``phase`` from the entry's stripe files; a piece the recorder left out (its digest
    captured before) from a piece of this entry with that digest, else ``earlier(digest, size)``."""
    out = bytearray()
    for k, piece in enumerate(region.pieces):
        if region.copied(phase, k):
            out += _read(entry.stripe_path(phase, piece.stripe), piece.offset, piece.size)
            continue
        digest = region.digest(phase, k)
        data = _same_digest(entry, digest, piece.size)
        if data is None:
            data = earlier(digest, piece.size)
        if data is None or len(data) != piece.size:
            raise ArtifactError(f"spool entry {entry.path}: {phase} piece {k} of region {region.base:#x} was not "
                                f"copied, and no earlier piece has its digest {digest}")  # fmt: skip
        out += data
    return bytes(out)


def _same_digest(entry: SpoolEntry, digest: str, size: int) -> bytes | None:
    for phase in ("prologue", "epilogue"):
        for r in entry.regions:
            for k, p in enumerate(r.pieces):
                if p.size == size and r.digest(phase, k) == digest and r.copied(phase, k):
                    return _read(entry.stripe_path(phase, p.stripe), p.offset, p.size)
    return None


def _read(path: Any, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)
