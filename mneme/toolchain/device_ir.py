"""Compile the device code of a CUDA source to LLVM bitcode, one module per kernel.

clang compiles the device side only (``--cuda-device-only``) at ``-O3`` with
the LLVM optimizer switched off (``-Xclang -disable-llvm-passes``): the
embedded IR is the front end's output, so the replay-time ``passes`` decide the
whole middle end, and clang still emits what optimized builds rely on
(libdevice linked in, no ``optnone``, TBAA). Each kernel then gets its own
module with ``opt -passes=internalize,globaldce``: the kernel and device
variables stay external, everything the kernel does not reach is dropped.

CUDA 13 removed a few headers clang's CUDA wrapper still includes; empty
stand-ins for them live in ``include_shim/`` and are searched last
(``-idirafter``), so a toolkit that still has them wins.

Standard library only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mneme.llvm.section import BitcodeRecord

SHIM_DIR = Path(__file__).resolve().parent / "include_shim"
_CLANG_CANDIDATES = ("clang++-19", "clang++-20", "clang++-21", "clang++-22", "clang++")
# clang 19 knows CUDA architectures up to sm_90a; newer GPUs get IR built for sm_90
# (the replay retargets it with compile_to_ptx(arch=...)).
_CLANG_MAX_ARCH = 90


class DeviceIRError(RuntimeError):
    """The device IR could not be produced (the user's nvcc build is unaffected)."""


@dataclass(frozen=True)
class LLVMTools:
    """The clang driver and the LLVM tools of the same installation."""

    clang: str
    opt: str
    llvm_dis: str
    version: str


def find_cuda_path() -> str:
    for candidate in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if candidate and Path(candidate, "include", "cuda_runtime.h").exists():
            return candidate
    nvcc = shutil.which("nvcc")
    if nvcc:
        return str(Path(nvcc).resolve().parent.parent)
    raise DeviceIRError("cannot find the CUDA toolkit; set CUDA_PATH")


def find_tools() -> LLVMTools:
    """clang++, opt and llvm-dis: ``MNEME_CLANG`` if set, else the newest clang++-NN on PATH."""
    clang = os.environ.get("MNEME_CLANG")
    if clang:
        clang = shutil.which(clang) or clang
    else:
        clang = next((p for p in map(shutil.which, _CLANG_CANDIDATES) if p), None)
    if not clang or not os.access(clang, os.X_OK):
        raise DeviceIRError(
            "no clang++ found for the device IR; install it (Debian: apt-get install -y clang-19 llvm-19) "
            "or set MNEME_CLANG"
        )
    real_dir = Path(clang).resolve().parent
    suffix = re.search(r"(-\d+)$", clang)
    tools = {}
    for tool in ("opt", "llvm-dis"):
        candidates = [real_dir / tool]
        if suffix:
            candidates.append(Path(shutil.which(tool + suffix.group(1)) or "/nonexistent"))
        found = next((str(c) for c in candidates if c.exists()), None)
        if found is None:
            raise DeviceIRError(f"{tool} not found beside {clang}; install the LLVM tools (apt-get install -y llvm-19)")
        tools[tool] = found
    out = subprocess.run([clang, "--version"], capture_output=True, text=True, check=False).stdout
    version = out.splitlines()[0].strip() if out else "clang"
    return LLVMTools(clang=clang, opt=tools["opt"], llvm_dis=tools["llvm-dis"], version=version)


def clang_arch(arch: str) -> str:
    match = re.fullmatch(r"sm_(\d+)([af]?)", arch)
    if not match or int(match.group(1)) > _CLANG_MAX_ARCH:
        return "sm_90"
    return arch


def compile_source(
    tools: LLVMTools, source: str, arch: str, flags: list[str], rdc: bool, workdir: str
) -> str:
    """Run clang on ``source``; returns the path of the translation unit's bitcode."""
    out = os.path.join(workdir, Path(source).stem + ".tu.bc")
    cmd = [
        tools.clang, "-x", "cuda", "--cuda-device-only", f"--cuda-gpu-arch={clang_arch(arch)}",
        f"--cuda-path={find_cuda_path()}", "-emit-llvm", "-c", "-O3", "-Xclang", "-disable-llvm-passes",
        "-idirafter", str(SHIM_DIR), "-Wno-unknown-cuda-version", "-w", *flags,
    ]
    if rdc:
        cmd.append("-fgpu-rdc")
    cmd += [source, "-o", out]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise DeviceIRError(f"clang could not compile the device code of {source}:\n{proc.stderr.strip()}")
    return out


_KERNEL_ANNOTATION = re.compile(r'!\{ptr @("?)([^",\s]+)\1, !"kernel", i32 1\}')
_KERNEL_DEFINE = re.compile(r'^define [^@]*\bptx_kernel\b[^@]*@("?)([^"(]+)\1\(', re.M)
_EXTERNAL_GLOBAL = re.compile(
    r'^@("?)([^"\s=]+)\1 = (?!private|internal|linkonce|weak|available_externally)[^\n]*\b(global|constant)\b', re.M
)


def kernels_and_globals(tools: LLVMTools, bitcode_path: str) -> tuple[list[str], list[str]]:
    """Kernel names and externally visible global variables of a bitcode module."""
    text = subprocess.run(
        [tools.llvm_dis, bitcode_path, "-o", "-"], capture_output=True, text=True, check=True
    ).stdout
    kernels = [m.group(2) for m in _KERNEL_ANNOTATION.finditer(text)]
    kernels += [m.group(2) for m in _KERNEL_DEFINE.finditer(text) if m.group(2) not in kernels]
    globals_ = [m.group(2) for m in _EXTERNAL_GLOBAL.finditer(text)]
    return kernels, globals_


def split_kernel(tools: LLVMTools, tu_bitcode: str, kernel: str, keep: list[str], workdir: str, index: int) -> bytes:
    """The module of ``kernel`` alone (plus the device variables, which must keep their names)."""
    out = os.path.join(workdir, f"kernel{index}.bc")
    api_list = ",".join([kernel, *keep])
    proc = subprocess.run(
        [tools.opt, "-passes=internalize,globaldce", f"-internalize-public-api-list={api_list}", tu_bitcode, "-o", out],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise DeviceIRError(f"opt could not extract kernel {kernel}: {proc.stderr.strip()}")
    return Path(out).read_bytes()


def device_records(source: str, arch: str, flags: list[str], rdc: bool = False) -> list[BitcodeRecord]:
    """One :class:`BitcodeRecord` per kernel defined in ``source``."""
    tools = find_tools()
    with tempfile.TemporaryDirectory(prefix="mneme-ir-") as workdir:
        tu = compile_source(tools, source, arch, flags, rdc, workdir)
        kernels, device_globals = kernels_and_globals(tools, tu)
        return [
            BitcodeRecord(
                kernels=(kernel,),
                bitcode=split_kernel(tools, tu, kernel, device_globals, workdir, i),
                source=os.path.abspath(source),
                arch=clang_arch(arch),
                producer=tools.version,
            )
            for i, kernel in enumerate(kernels)
        ]
