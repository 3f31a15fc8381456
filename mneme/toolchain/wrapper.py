"""The compiler wrappers ``mneme config cc`` and ``mneme config cxx`` print.

``c++`` mode runs the user's nvcc command unchanged, then compiles the device
code of each CUDA source with clang to per-kernel LLVM bitcode and embeds it in
the ``.mneme_bitcode`` section of what nvcc produced (the object of a ``-c``
step, else the executable or shared library). The kernels that run stay nvcc's.

``cc`` mode runs the host C compiler unchanged (C sources have no device code).

``embed`` mode takes the same arguments as ``c++`` but runs no nvcc: it embeds
the IR of the named sources into the existing file named by ``-o`` (what the
CMake function ``add_mneme(target)`` runs after a target is linked).

A failure to produce the IR never fails the build: the wrapper prints a warning
and the program is still recordable through the PTX tier. Set
``MNEME_IR_STRICT=1`` to make it an error, ``MNEME_NO_IR=1`` to skip the IR.
Standard library only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from mneme.toolchain import device_ir, nvcc_args
from mneme.toolchain.embed import EmbedError, embed_records

_HOST_FORWARDING = ["-forward-unknown-to-host-compiler", "-forward-unknown-to-host-linker"]


def _warn(message: str) -> None:
    print(f"mneme: warning: {message}", file=sys.stderr)


def find_nvcc() -> str:
    """The real nvcc: ``MNEME_NVCC``, else nvcc on PATH (never this wrapper), else the toolkit's."""
    explicit = os.environ.get("MNEME_NVCC")
    if explicit:
        return explicit
    me = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    on_path = shutil.which("nvcc")
    if on_path and Path(on_path).resolve() != me:
        return on_path
    try:
        return str(Path(device_ir.find_cuda_path(), "bin", "nvcc"))
    except device_ir.DeviceIRError:
        return "nvcc"


def _ir_targets(inv: nvcc_args.NvccInvocation) -> list[tuple[str, list[str]]]:
    """(file to embed into, CUDA sources whose kernels go there)."""
    if not inv.produces_binary or not inv.cuda_sources:
        return []
    if inv.compile_only:
        return [(inv.object_for(src), [src]) for src in inv.cuda_sources]
    return [(inv.binary_output, list(inv.cuda_sources))]


def add_device_ir(inv: nvcc_args.NvccInvocation) -> int:
    """Embed the IR of ``inv``'s CUDA sources; 0, or 1 on failure under MNEME_IR_STRICT."""
    if os.environ.get("MNEME_NO_IR") == "1":
        return 0
    strict = os.environ.get("MNEME_IR_STRICT") == "1"
    status = 0
    for target, sources in _ir_targets(inv):
        records = []
        for src in sources:
            try:
                records += device_ir.device_records(src, inv.ir_arch, inv.clang_flags, inv.relocatable_device_code)
            except (device_ir.DeviceIRError, OSError, subprocess.CalledProcessError) as exc:
                _warn(f"no LLVM IR for the kernels of {src} ({exc}); they stay replayable through PTX")
                status = 1
        if not records:
            continue
        try:
            embed_records(target, records)
        except EmbedError as exc:
            _warn(f"could not embed the LLVM IR into {target}: {exc}")
            status = 1
    return status if strict else 0


def main(mode: str, argv: list[str]) -> int:
    if mode == "cc":
        compiler = os.environ.get("MNEME_HOST_CC") or os.environ.get("CC_FOR_MNEME") or "cc"
        return subprocess.call([compiler, *argv])
    if mode not in ("c++", "embed"):
        print(f"mneme toolchain: unknown mode {mode!r}; use cc, c++ or embed", file=sys.stderr)
        return 2
    inv = nvcc_args.parse(argv)
    if mode == "c++":
        extra = [] if os.environ.get("MNEME_NVCC_EXACT") == "1" else _HOST_FORWARDING
        code = subprocess.call([find_nvcc(), *extra, *argv])
        if code != 0:
            return code
    elif not inv.output or not os.path.exists(inv.output):
        print("mneme embed: give the existing ELF file to embed into with -o FILE", file=sys.stderr)
        return 2
    else:
        inv.compile_only = False
    return add_device_ir(inv)
