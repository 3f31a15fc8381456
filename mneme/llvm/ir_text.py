"""Edits on textual LLVM IR that llvmlite's binding cannot make on a parsed module.

llvmlite reads modules well but changes little (no calling conventions, no
string attributes, no replace-all-uses). The compile step therefore prints the
module once, applies these edits to the text and parses it once: retargeting,
launch bounds, launch-dimension constants and the specialization entry point.
"""

from __future__ import annotations

import re

from mneme.errors import ConfigurationError

# Minimum PTX ISA version per architecture (PTX ISA release notes).
_MIN_PTX = {70: 60, 72: 61, 75: 63, 80: 70, 86: 71, 87: 74, 89: 78, 90: 78, 100: 86, 101: 86, 103: 88, 120: 87, 121: 88}
_DEFAULT_PTX = 80


def _quoted(name: str) -> str:
    return re.escape(name) if re.fullmatch(r"[-a-zA-Z$._][-a-zA-Z$._0-9]*", name) else re.escape(f'"{name}"')


def symbol(name: str) -> str:
    """``@name`` as LLVM prints it (quoted when it has characters outside the bare set)."""
    return f"@{name}" if re.fullmatch(r"[-a-zA-Z$._][-a-zA-Z$._0-9]*", name) else f'@"{name}"'


def define_pattern(name: str) -> re.Pattern:
    """The ``define`` line of function ``name``: groups head, params, tail."""
    return re.compile(
        rf"^define (?P<head>[^\n]*?)@{_quoted(name)}\((?P<params>[^\n]*)\)(?P<tail>[^\n]*)\{{$", re.M
    )


def find_define(text: str, name: str) -> re.Match:
    match = define_pattern(name).search(text)
    if match is None:
        raise ConfigurationError(f"function {name} has no definition in the module")
    return match


_KERNEL_DEFINE = re.compile(r'^define [^\n@]*\bptx_kernel\b[^\n@]*@("?)([^"(\n]+)\1\(', re.M)
_KERNEL_ANNOTATION = re.compile(r'!\{ptr @("?)([^",\s]+)\1, !"kernel", i32 1\}')


def kernel_names(text: str) -> list[str]:
    """Kernels of a module: ``ptx_kernel`` functions (LLVM >= 20) or ``nvvm.annotations`` kernels."""
    names = [m.group(2) for m in _KERNEL_DEFINE.finditer(text)]
    names += [m.group(2) for m in _KERNEL_ANNOTATION.finditer(text) if m.group(2) not in names]
    return names


def ptx_features(text: str, arch: str) -> str:
    """``+ptxNN,+sm_XX`` for ``arch``: the recorded PTX version, raised to what ``arch`` needs."""
    match = re.fullmatch(r"sm_(\d+)[af]?", arch)
    if not match:
        raise ConfigurationError(f"arch={arch!r} is not a CUDA architecture like 'sm_90'")
    recorded = [int(v) for v in re.findall(r"\+ptx(\d+)", text)]
    version = max([*recorded, _MIN_PTX.get(int(match.group(1)), _DEFAULT_PTX)])
    return f"+ptx{version},+{arch}"


def retarget(text: str, arch: str, features: str) -> str:
    """Point every function's ``target-cpu``/``target-features`` at ``arch``.

    They override the target machine per function, so IR recorded for one GPU
    must be rewritten to compile for another.
    """
    text = re.sub(r'"target-cpu"="[^"]*"', f'"target-cpu"="{arch}"', text)
    return re.sub(r'"target-features"="[^"]*"', f'"target-features"="{features}"', text)


def add_function_attributes(text: str, name: str, attributes: dict[str, str]) -> str:
    """Add string attributes (``"key"="value"``) to the definition of ``name``."""
    match = find_define(text, name)
    extra = "".join(f' "{k}"="{v}"' for k, v in attributes.items())
    start, end = match.span("tail")
    return text[:start] + match.group("tail").rstrip() + extra + " " + text[end:]


def add_launch_bounds(text: str, kernel: str, max_threads: int, min_blocks: int | None, attributes: bool) -> str:
    """``.maxntid``/``.minnctapersm`` for ``kernel``: function attributes ``"nvvm.maxntid"``/
    ``"nvvm.minctasm"`` (LLVM >= 21), else ``nvvm.annotations`` entries (older LLVM)."""
    if attributes:
        bounds = {"nvvm.maxntid": str(max_threads)}
        if min_blocks:
            bounds["nvvm.minctasm"] = str(min_blocks)
        return add_function_attributes(text, kernel, bounds)
    entries = [f'!{{ptr {symbol(kernel)}, !"maxntidx", i32 {max_threads}}}']
    if min_blocks:
        entries.append(f'!{{ptr {symbol(kernel)}, !"minctasm", i32 {min_blocks}}}')
    first = 1 + max((int(n) for n in re.findall(r"^!(\d+) = ", text, re.M)), default=-1)
    ids = [f"!{first + i}" for i in range(len(entries))]
    named = re.search(r"^!nvvm\.annotations = !\{(.*)\}$", text, re.M)
    if named:
        listed = named.group(1).strip()
        joined = ", ".join(([listed] if listed else []) + ids)
        text = text[: named.start()] + f"!nvvm.annotations = !{{{joined}}}" + text[named.end() :]
    else:
        text += f"\n!nvvm.annotations = !{{{', '.join(ids)}}}\n"
    return text + "\n" + "\n".join(f"{i} = {e}" for i, e in zip(ids, entries)) + "\n"


_SREG_CALL = re.compile(
    r"call (?P<attrs>(?:[a-z]+(?:\([^)]*\))? )*)i32 @llvm\.nvvm\.read\.ptx\.sreg\."
    r"(?P<reg>ntid|nctaid|tid|ctaid)\.(?P<axis>[xyz])\(\)(?P<tail>(?: #\d+)?)"
)


def specialize_dims(text: str, grid: tuple[int, int, int], block: tuple[int, int, int]) -> str:
    """Launch dimensions as constants: ``ntid``/``nctaid`` reads become the values, and
    ``tid``/``ctaid`` reads get the ranges the dimensions imply, so bounds checks fold."""
    sizes = {"ntid": block, "nctaid": grid, "tid": block, "ctaid": grid}

    def replace(match: re.Match) -> str:
        value = sizes[match.group("reg")]["xyz".index(match.group("axis"))]
        if match.group("reg") in ("ntid", "nctaid"):
            return f"add i32 {value}, 0"
        return (
            f"call range(i32 0, {value}) i32 @llvm.nvvm.read.ptx.sreg."
            f"{match.group('reg')}.{match.group('axis')}(){match.group('tail')}"
        )

    for dims, what in ((grid, "grid"), (block, "block")):
        if len(dims) != 3 or any(not isinstance(v, int) or v < 1 for v in dims):
            raise ConfigurationError(f"{what} dimensions {dims!r} must be three positive integers")
    return _SREG_CALL.sub(replace, text)
