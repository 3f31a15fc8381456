"""PTX rewriting for the PTX tier: launch bounds, specialization, dimension constants.

Pure text transformations of one ``.entry`` in a PTX module. They run in the
CPU compile pool (no CUDA), so they must be deterministic and cheap; every
rewrite that changes the code is visible in the PTX (tests and users can read
the directive or the immediate that replaced a load).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from mneme.errors import ConfigurationError

# Sizes and alignments of PTX parameter types.
_TYPE_SIZES = {
    "b8": 1, "u8": 1, "s8": 1, "pred": 1,
    "b16": 2, "u16": 2, "s16": 2, "f16": 2, "bf16": 2,
    "b32": 4, "u32": 4, "s32": 4, "f32": 4,
    "b64": 8, "u64": 8, "s64": 8, "f64": 8,
}  # fmt: skip
# mov has no 8-bit forms: an 8-bit ld.param writes a 16-bit register.
_MOV_TYPE = {"b8": "b16", "u8": "u16", "s8": "s16"}

_ENTRY = re.compile(r"\.entry\s+(?P<name>[\w$.]+)\s*\(")
_PARAM_DECL = re.compile(
    r"\.param\s+(?:\.align\s+(?P<align>\d+)\s+)?\.(?P<type>\w+)\s+(?:\.ptr\s+\.\w+\s+(?:\.align\s+\d+\s+)?)?"
    r"(?P<name>[\w$.]+)\s*(?:\[(?P<count>\d+)\])?"
)
_PERF_DIRECTIVE = re.compile(r"\s*\.(maxntid|minnctapersm|reqntid|maxnreg|maxclusterrank)\b[^\n{]*")


@dataclass(frozen=True)
class PtxParam:
    """One ``.param`` of the entry: its name and place in the parameter buffer."""

    name: str
    type: str
    offset: int
    size: int


@dataclass(frozen=True)
class EntrySpan:
    """Where the entry is in the text: its header (params and directives) and its body."""

    name: str
    params: tuple[PtxParam, ...]
    header_start: int  # at ".entry"
    params_end: int  # just after the ')' closing the parameter list
    body_start: int  # at the '{' opening the body
    body_end: int  # just after the matching '}'


def find_entry(ptx: str, kernel: str) -> EntrySpan:
    """Locate ``kernel``'s ``.entry``; ConfigurationError when the module has no such entry."""
    for match in _ENTRY.finditer(ptx):
        if match.group("name") != kernel:
            continue
        open_paren = match.end() - 1
        close_paren = ptx.index(")", open_paren)
        params = _parse_params(ptx[open_paren + 1 : close_paren])
        body_start = ptx.index("{", close_paren)
        depth, i = 0, body_start
        while i < len(ptx):
            if ptx[i] == "{":
                depth += 1
            elif ptx[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        else:
            raise ConfigurationError(f"the PTX body of {kernel} is not closed; the recorded PTX is truncated")
        return EntrySpan(kernel, params, match.start(), close_paren + 1, body_start, i + 1)
    entries = [m.group("name") for m in _ENTRY.finditer(ptx)]
    raise ConfigurationError(f"the recorded PTX has no .entry {kernel} (entries: {', '.join(entries) or 'none'})")


def _parse_params(text: str) -> tuple[PtxParam, ...]:
    params = []
    offset = 0
    for decl in text.split(","):
        decl = decl.strip()
        if not decl:
            continue
        m = _PARAM_DECL.search(decl)
        if not m or m.group("type") not in _TYPE_SIZES:
            raise ConfigurationError(f"cannot read the PTX parameter declaration {decl!r}")
        elem = _TYPE_SIZES[m.group("type")]
        count = int(m.group("count") or 1)
        align = int(m.group("align") or elem)
        offset = (offset + align - 1) // align * align
        params.append(PtxParam(m.group("name"), m.group("type"), offset, elem * count))
        offset += elem * count
    return tuple(params)


def set_launch_bounds(ptx: str, kernel: str, max_threads: int, min_blocks_per_sm: int | None) -> str:
    """Put ``.maxntid`` (and ``.minnctapersm`` when >= 1) on the entry, replacing existing ones."""
    if max_threads < 1:
        raise ConfigurationError(f"max_threads={max_threads} must be at least 1")
    span = find_entry(ptx, kernel)
    between = ptx[span.params_end : span.body_start]
    kept = _PERF_DIRECTIVE.sub("", between).rstrip()
    directives = f"\n.maxntid {max_threads}, 1, 1"
    if min_blocks_per_sm is not None and min_blocks_per_sm >= 1:
        directives += f"\n.minnctapersm {min_blocks_per_sm}"
    return ptx[: span.params_end] + kept + directives + "\n" + ptx[span.body_start :]


def specialize_dims(ptx: str, kernel: str, grid: tuple[int, int, int], block: tuple[int, int, int]) -> str:
    """Replace reads of ``%ntid.*`` / ``%nctaid.*`` in the entry body with the launch's values."""
    span = find_entry(ptx, kernel)
    values = {f"ntid.{a}": v for a, v in zip("xyz", block)}
    values.update({f"nctaid.{a}": v for a, v in zip("xyz", grid)})

    def repl(m: re.Match[str]) -> str:
        return f"{m.group(1)}{values[m.group(2)]}"

    body = re.sub(r"(mov\.u32\s+%\w+\s*,\s*)%(ntid\.[xyz]|nctaid\.[xyz])\b", repl, ptx[span.body_start : span.body_end])
    return ptx[: span.body_start] + body + ptx[span.body_end :]


def specialize_params(ptx: str, kernel: str, args: bytes, scalar_offsets: set[int] | None = None) -> str:
    """Replace whole-parameter ``ld.param`` loads of scalar parameters with immediates from ``args``.

    ``scalar_offsets`` names the buffer offsets of the parameters the recording
    says are scalars; pointers and aggregates keep their loads (None: every
    parameter that is not 8 bytes wide counts as a scalar).
    """
    span = find_entry(ptx, kernel)
    by_name = {p.name: p for p in span.params}
    ld = re.compile(r"ld\.param\.(?P<type>[a-z]+\d+)\s+(?P<dst>%\w+)\s*,\s*\[(?P<name>[\w$.]+)(?:\+(?P<off>\d+))?\]\s*;")

    def repl(m: re.Match[str]) -> str:
        param = by_name.get(m.group("name"))
        ty = m.group("type")
        if param is None or ty not in _TYPE_SIZES:
            return m.group(0)
        scalar = param.offset in scalar_offsets if scalar_offsets is not None else param.size != 8
        if not scalar:
            return m.group(0)
        start = param.offset + int(m.group("off") or 0)
        size = _TYPE_SIZES[ty]
        if start + size > len(args):
            raise ConfigurationError(
                f"parameter {param.name} needs bytes {start}..{start + size} but the recorded arguments have {len(args)}"
            )
        return f"mov.{_MOV_TYPE.get(ty, ty)} {m.group('dst')}, {immediate(ty, args[start : start + size])};"

    body = ld.sub(repl, ptx[span.body_start : span.body_end])
    return ptx[: span.body_start] + body + ptx[span.body_end :]


def immediate(ptx_type: str, raw: bytes) -> str:
    """The PTX immediate for little-endian ``raw`` bytes of ``ptx_type`` (floats as exact hex)."""
    if ptx_type == "f32":
        return "0f%08X" % struct.unpack("<I", raw)[0]
    if ptx_type == "f64":
        return "0d%016X" % struct.unpack("<Q", raw)[0]
    value = int.from_bytes(raw, "little", signed=ptx_type.startswith("s"))
    return str(value)


def target_arch(ptx: str) -> str | None:
    """The ``.target`` architecture of a PTX module (``sm_90``), if it names one."""
    m = re.search(r"^\s*\.target\s+(sm_\d+[a-z]?)", ptx, re.MULTILINE)
    return m.group(1) if m else None
