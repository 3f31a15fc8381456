"""Read what an nvcc command line builds, so the wrapper can add the device IR beside it.

The wrapper never rewrites the user's nvcc command: this module only extracts
the CUDA sources, the output file, the build step (compile only, or compile and
link), the GPU architecture and the preprocessor flags clang needs to see the
same code. Standard library only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

CUDA_SUFFIXES = (".cu",)
CXX_SUFFIXES = (".cpp", ".cc", ".cxx", ".c++", ".C", ".c")

# nvcc options that take their value as the next argument when it is not attached with '='.
_VALUE_OPTIONS = {
    "-o", "--output-file", "-I", "--include-path", "-D", "--define-macro", "-U", "--undefine-macro",
    "-L", "--library-path", "-l", "--library", "-include", "--pre-include", "-isystem", "--system-include",
    "-x", "--x", "-arch", "--gpu-architecture", "-code", "--gpu-code", "-gencode", "--generate-code",
    "-Xcompiler", "--compiler-options", "-Xlinker", "--linker-options", "-Xptxas", "--ptxas-options",
    "-Xnvlink", "--nvlink-options", "-Xarchive", "--archive-options", "-Xcudafe", "-ccbin",
    "--compiler-bindir", "-std", "--std", "-MF", "--dependency-output", "-MT", "-MQ", "-maxrregcount",
    "--maxrregcount", "-t", "--threads", "-rdc", "--relocatable-device-code", "-odir", "--output-directory",
    "-ftz", "-prec-div", "-prec-sqrt", "-fmad", "--ftz", "--prec-div", "--prec-sqrt", "--fmad",
    "-idirafter", "-iquote", "--default-stream", "-default-stream", "-cudart", "--cudart", "-time",
    "--keep-dir", "-keep-dir", "-Werror", "--Werror", "-diag-suppress", "--diag-suppress",
}
# Options that stop nvcc from producing an object or an executable: nothing to embed into.
_NO_OUTPUT_OPTIONS = {
    "-E", "--preprocess", "-M", "--generate-dependencies", "-MM", "--generate-nonsystem-dependencies",
    "-ptx", "--ptx", "-cubin", "--cubin", "-fatbin", "--fatbin", "-optix-ir", "--optix-ir", "-ltoir",
    "--dryrun", "-dryrun", "--version", "-V", "--help", "-h", "-lib", "--lib", "-run", "--run",
    "-cuda", "--cuda", "-link", "-dlink", "--device-link", "-lto", "-dlto",
}
_COMPILE_ONLY_OPTIONS = {"-c", "--compile", "-dc", "--device-c", "-dw", "--device-w"}


@dataclass
class NvccInvocation:
    """What one nvcc command line builds."""

    argv: list[str]
    sources: list[str] = field(default_factory=list)
    cuda_sources: list[str] = field(default_factory=list)
    output: str | None = None
    compile_only: bool = False
    produces_binary: bool = True
    relocatable_device_code: bool = False
    archs: list[str] = field(default_factory=list)
    clang_flags: list[str] = field(default_factory=list)
    language_cuda: bool = False

    @property
    def ir_arch(self) -> str:
        """The sm_XX to compile the device IR for (the first real architecture named, else sm_90)."""
        for arch in self.archs:
            if re.fullmatch(r"sm_\d+[af]?", arch):
                return arch
        return "sm_90"

    def object_for(self, source: str) -> str:
        """The object file nvcc writes for ``source`` in a compile-only step."""
        if self.output and len(self.sources) == 1:
            return self.output
        return os.path.splitext(os.path.basename(source))[0] + ".o"

    @property
    def binary_output(self) -> str:
        return self.output or "a.out"


def _split(arg: str) -> tuple[str, str | None]:
    if arg.startswith("--") or arg.startswith("-") and "=" in arg:
        name, eq, value = arg.partition("=")
        if eq and name in _VALUE_OPTIONS | _NO_OUTPUT_OPTIONS | _COMPILE_ONLY_OPTIONS:
            return name, value
    return arg, None


def _archs_from(name: str, value: str) -> list[str]:
    """sm_XX names from -arch/-code/-gencode values (compute_XX counts as sm_XX)."""
    found = re.findall(r"(?:sm|compute|lto)_(\d+[af]?)", value)
    return [f"sm_{n}" for n in found]


def parse(argv: list[str]) -> NvccInvocation:
    """Parse an nvcc command line (without the program name)."""
    inv = NvccInvocation(argv=list(argv))
    language = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, value = _split(arg)
        takes_value = name in _VALUE_OPTIONS and value is None
        if takes_value:
            value = argv[i + 1] if i + 1 < len(argv) else ""
            i += 1
        i += 1
        if name in ("-o", "--output-file"):
            inv.output = value
        elif name in _COMPILE_ONLY_OPTIONS:
            inv.compile_only = True
            if name in ("-dc", "--device-c"):
                inv.relocatable_device_code = True
        elif name in _NO_OUTPUT_OPTIONS:
            inv.produces_binary = False
        elif name in ("-rdc", "--relocatable-device-code"):
            inv.relocatable_device_code = (value or "").lower() in ("true", "1")
        elif name in ("-x", "--x"):
            language = value
            inv.language_cuda = value == "cu"
        elif name in ("-arch", "--gpu-architecture", "-code", "--gpu-code", "-gencode", "--generate-code"):
            inv.archs.extend(_archs_from(name, value or ""))
        elif name in ("-I", "--include-path", "-isystem", "--system-include", "-idirafter", "-iquote"):
            flag = {"--include-path": "-I", "--system-include": "-isystem"}.get(name, name)
            inv.clang_flags += [flag, value or ""]
        elif name in ("-D", "--define-macro", "-U", "--undefine-macro"):
            flag = {"--define-macro": "-D", "--undefine-macro": "-U"}.get(name, name)
            inv.clang_flags.append(flag + (value or ""))
        elif name in ("-include", "--pre-include"):
            inv.clang_flags += ["-include", value or ""]
        elif name in ("-std", "--std"):
            inv.clang_flags.append(f"-std={value}")
        elif name in ("-ftz", "--ftz") and (value or "").lower() == "true":
            inv.clang_flags.append("-fgpu-flush-denormals-to-zero")
        elif name in ("-use_fast_math", "--use_fast_math"):
            inv.clang_flags += ["-ffast-math", "-fgpu-flush-denormals-to-zero"]
        elif not takes_value and value is None and len(arg) > 2 and arg[:2] in ("-I", "-D", "-U"):
            inv.clang_flags.append(arg)  # attached form: -Ipath, -DNAME=1
        elif arg.startswith("-std="):
            inv.clang_flags.append(arg)
        elif not arg.startswith("-"):
            if arg.endswith(CUDA_SUFFIXES) or arg.endswith(CXX_SUFFIXES):
                inv.sources.append(arg)
                if arg.endswith(CUDA_SUFFIXES) or language == "cu":
                    inv.cuda_sources.append(arg)
    return inv
