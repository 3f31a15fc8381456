"""Argument specialization: a kernel's parameters replaced by their recorded values.

The kernel's body is renamed ``<kernel>.mneme.body`` (internal, ``alwaysinline``,
ordinary calling convention) and a new entry point with the kernel's name and
signature calls it with the recorded constants in place of the specialized
parameters. After the always-inliner runs (compile's preprocessing) the
constants sit where the parameters were used and the pipeline folds them:
fewer ``ld.param``, folded bounds and trip counts.

Scalars (integers, floats, pointers) become immediate constants; anything
else (vectors, aggregates, ``byval`` structs) is read from an internal
constant global holding the recorded bytes, which LLVM folds the same way.
The entry point keeps the full parameter list, so the launch ABI (the
argument buffer the replay passes) does not change.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from mneme.errors import ConfigurationError
from mneme.llvm.ir_text import find_define, symbol

BODY_SUFFIX = ".mneme.body"
_LINKAGE_WORDS = {
    "private", "internal", "available_externally", "linkonce", "weak", "common", "appending",
    "extern_weak", "linkonce_odr", "weak_odr", "external", "dso_local", "dso_preemptable",
    "default", "hidden", "protected", "ptx_kernel", "dllimport", "dllexport",
}


@dataclass(frozen=True)
class Param:
    """What specialization needs to know about one kernel parameter."""

    type: str
    attributes: tuple[str, ...]
    size: int
    byval_type: str | None = None


def describe_params(module, kernel: str) -> list[Param]:
    """Parameter types, attributes and sizes of ``kernel`` from a parsed module."""
    from mneme.llvm._binding import llvm

    data = llvm().create_target_data(module.data_layout)
    fn = module.get_function(kernel)
    params = []
    for arg in fn.arguments:
        attrs = tuple(a.decode() if isinstance(a, bytes) else str(a) for a in arg.attributes)
        byval = next((re.fullmatch(r"byval\((.*)\)", a).group(1) for a in attrs if a.startswith("byval(")), None)
        size = data.get_abi_size(arg.type)
        if byval is not None:
            size = _byval_size(module, data, byval)
        params.append(Param(type=str(arg.type), attributes=attrs, size=size, byval_type=byval))
    return params


def _byval_size(module, data, type_text: str) -> int:
    match = re.fullmatch(r'%"?([^"]+)"?', type_text)
    if match:
        return data.get_abi_size(module.get_struct_type(match.group(1)))
    return -1  # a literal type: trust the recorded size


def _int_constant(value: bytes, bits: int) -> str:
    number = int.from_bytes(value, "little", signed=False) & ((1 << bits) - 1)
    if number >> (bits - 1):
        number -= 1 << bits
    return str(number)


def _float_constant(type_text: str, value: bytes) -> str | None:
    """LLVM's exact hexadecimal spelling of a floating-point constant."""
    if type_text == "float":
        (as_float,) = struct.unpack("<f", value)
        return "0x%016X" % struct.unpack("<Q", struct.pack("<d", as_float))[0]
    if type_text == "double":
        return "0x%016X" % struct.unpack("<Q", value)[0]
    if type_text == "half":
        return "0xH%04X" % struct.unpack("<H", value)[0]
    if type_text == "bfloat":
        return "0xR%04X" % struct.unpack("<H", value)[0]
    return None


def scalar_constant(param: Param, value: bytes) -> str | None:
    """The constant operand for a scalar parameter, or None when it must go through memory."""
    if param.byval_type is not None:
        return None
    int_type = re.fullmatch(r"i(\d+)", param.type)
    if int_type:
        return _int_constant(value, int(int_type.group(1)))
    if param.type == "ptr" or re.fullmatch(r"ptr addrspace\(\d+\)", param.type):
        address = int.from_bytes(value[:8], "little")
        return "null" if address == 0 else f"inttoptr (i64 {address} to {param.type})"
    return _float_constant(param.type, value)


def _bytes_literal(value: bytes) -> str:
    return "".join(chr(b) if 32 <= b < 127 and chr(b) not in '"\\' else f"\\{b:02X}" for b in value)


def specialize_arguments(text: str, kernel: str, params: list[Param], values: dict[int, bytes]) -> str:
    """Rewrite ``text`` so ``kernel`` runs with ``values`` (parameter index -> recorded bytes)."""
    for index, value in values.items():
        if not isinstance(index, int) or not 0 <= index < len(params):
            raise ConfigurationError(
                f"cannot specialize parameter {index!r} of {kernel}: it has {len(params)} parameters (0-based)"
            )
        expected = params[index].size
        if not isinstance(value, (bytes, bytearray)) or (expected >= 0 and len(value) != expected):
            raise ConfigurationError(
                f"parameter {index} of {kernel} is {params[index].type} ({expected} bytes) but the recorded "
                f"value has {len(value) if isinstance(value, (bytes, bytearray)) else type(value).__name__} bytes"
            )
    match = find_define(text, kernel)
    body = kernel + BODY_SUFFIX
    body_head = " ".join(w for w in match.group("head").split() if w not in _LINKAGE_WORDS)
    body_define = f"define internal {body_head} {symbol(body)}({match.group('params')}){match.group('tail')}{{"
    text = text[: match.start()] + body_define + text[match.end() :]

    globals_, loads, call_args, entry_params = [], [], [], []
    for i, param in enumerate(params):
        attrs = " ".join(param.attributes)
        entry_params.append(f"{param.type} {attrs} %a{i}".replace("  ", " "))
        byval_attr = f"byval({param.byval_type}) " if param.byval_type else ""
        if i not in values:
            call_args.append(f"{param.type} {byval_attr}%a{i}")
            continue
        value = bytes(values[i])
        constant = scalar_constant(param, value)
        if constant is not None:
            call_args.append(f"{param.type} {constant}")
            continue
        holder = symbol(f"{kernel}.mneme.arg{i}")
        globals_.append(f'{holder} = internal constant [{len(value)} x i8] c"{_bytes_literal(value)}", align 8')
        if param.byval_type:
            call_args.append(f"ptr {byval_attr}{holder}")
        else:
            loads.append(f"  %v{i} = load {param.type}, ptr {holder}, align 1")
            call_args.append(f"{param.type} %v{i}")
    entry = [
        f"define {match.group('head')}{symbol(kernel)}({', '.join(entry_params)}){match.group('tail')}{{",
        *loads,
        f"  call void {symbol(body)}({', '.join(call_args)})",
        "  ret void",
        "}",
    ]
    return text + "\n" + "\n".join(globals_) + "\n" + "\n".join(entry) + "\n"
