"""The code a configuration runs: the recorded cubin, or a recompile (PTX or LLVM tier).

``compile_for`` is pure CPU work (PTX rewriting, PTX to cubin, the LLVM tier
through ``mneme.llvm``), with picklable inputs and output, so the replay
server can run it in a process pool ahead of the GPU. Products are cached by
content (the final PTX text, the ptxas options and the compiler's exact
version): in memory per process and on disk under ``$MNEME_CACHE_DIR``
(default ``~/.cache/mneme``), so a compile done once is never done again.

PTX becomes a cubin through one of two compilers (``$MNEME_PTX_COMPILER``):
NVIDIA's nvPTXCompiler library in-process (``mneme._ptxcompiler``, built when
the library was found; ``auto``, the default, uses it when it imports), or the
``ptxas`` program in a subprocess (``ptxas``, and ``auto`` without the
module). Both give the same cubin for the same options; the library saves
the process start (a few milliseconds per compile). A compile the library
fails is tried again with ``ptxas`` where ptxas is installed, so an error
message is ptxas's and the library never fails code ptxas would compile.

Which knobs recompile:

* none (the baseline): the recorded cubin, byte for byte, as the application ran it;
* ``codegen_opt`` != 3, a register cap, ``set_launch_bounds``, ``specialize``,
  ``specialize_dims``: the recorded PTX, rewritten (``mneme.replay.ptx``), then
  ``ptxas -O<n>`` (``codegen_opt`` 0..3 are ``-O0``..``-O3``; 4 is ``-O3`` with
  ``--allow-expensive-optimizations true``);
* ``passes`` other than ``default<O3>``: the LLVM tier, which needs the kernel's
  bitcode (a recording of a program built with ``mneme config cxx`` /
  ``add_mneme``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from mneme._internal.cache_dir import cache_root
from mneme.errors import ConfigurationError, MnemeError, NotAvailableError
from mneme.model.experiment import DEFAULT_PASSES, ExperimentConfiguration
from mneme.replay import ptx as ptxrw

#: codegen_opt of the baseline (the recorded code was built at ptxas' default -O3).
BASELINE_CODEGEN_OPT = 3
#: ptxas gets at most this long per kernel.
PTXAS_TIMEOUT_S = 120.0
MEMORY_CACHE_ENTRIES = 256


#: Which PTX compiler compiles: auto (the library when it is built, else ptxas), library, or ptxas.
PTX_COMPILER_ENV = "MNEME_PTX_COMPILER"
PTX_COMPILER_CHOICES = ("auto", "library", "ptxas")


class CompileError(MnemeError):
    """The configuration's code could not be produced (ptxas or the LLVM tier failed, or needs what is missing)."""


@dataclass(frozen=True)
class CompiledCode:
    """A loadable image and how it was made. Picklable: it crosses process boundaries."""

    image: bytes  # cubin
    tier: str  # "recorded" (the application's cubin), "ptx" or "llvm"
    key: str  # content hash of what was compiled ("" for the recorded cubin)
    arch: str
    ptx: str | None = None  # the PTX that was compiled (None for the recorded cubin)
    codegen_time: float = 0.0  # seconds in ptxas (0 when it came from a cache) and LLVM code generation
    opt_time: float = 0.0  # seconds in the LLVM pass pipeline
    preprocess_ir_time: float = 0.0  # seconds preparing the IR (specialization, pruning)
    cached: bool = False
    log: str = ""

    @property
    def obj_size(self) -> int:
        return len(self.image)


@dataclass(frozen=True)
class CompileOptions:
    """Replay-time compile settings that are not part of ExperimentConfiguration."""

    max_registers: int | None = None  # ptxas --maxrregcount

    def __post_init__(self) -> None:
        if self.max_registers is not None and not 16 <= self.max_registers <= 255:
            raise ConfigurationError(f"max_registers={self.max_registers} must be in 16..255")


def needs_recompile(config: ExperimentConfiguration, options: CompileOptions = CompileOptions()) -> bool:
    """Whether ``config`` runs other code than the recorded cubin."""
    return bool(
        config.passes.strip() != DEFAULT_PASSES
        or config.codegen_opt != BASELINE_CODEGEN_OPT
        or config.specialize
        or config.specialize_dims
        or config.set_launch_bounds
        or options.max_registers is not None
    )


def compile_for(
    recording: Any,
    instance: Any,
    config: ExperimentConfiguration,
    arch: str,
    options: CompileOptions = CompileOptions(),
    *,
    cache: "CompileCache | None" = None,
) -> CompiledCode:
    """The code ``config`` runs for ``instance`` on a GPU of ``arch`` (``sm_90``). CPU only.

    Raises ConfigurationError for an invalid configuration and CompileError when
    the code cannot be produced.
    """
    errors = config.validation_errors()
    if errors:
        raise ConfigurationError("invalid configuration: " + "; ".join(errors))
    cache = cache if cache is not None else default_cache()
    if not needs_recompile(config, options):
        if recording.code.cubin is not None and _cubin_runs_on(recording.code.arch, arch):
            return CompiledCode(recording.load_code("cubin"), "recorded", "", recording.code.arch)
        # No usable cubin (PTX-only recording, or another GPU): the baseline is the recorded PTX at -O3.
    tier = "ptx"
    timings = None
    if config.passes.strip() != DEFAULT_PASSES:
        if recording.code.bitcode is None:
            raise CompileError(
                f"passes={config.passes!r} needs the LLVM tier, and this recording has no LLVM bitcode for "
                f"{recording.kernel_name}; record a build made with `mneme config cxx` / CMake add_mneme(), "
                "or tune only PTX-tier knobs (codegen_opt, launch bounds, specialization, launch shape)"
            )
        source, timings = _llvm_ptx(recording, instance, config, arch)
        tier = "llvm"
    else:
        if recording.code.ptx is None:
            raise CompileError(
                f"this configuration recompiles {recording.kernel_name}, but the recording has no PTX "
                "(cubin only): only the launch shape can be tuned; rebuild the application with PTX embedded "
                "(nvcc's default -arch=sm_XX embeds it)"
            )
        source = rewrite_ptx(
            recording.load_code("ptx").decode("utf-8"),
            recording.kernel_name,
            config,
            instance.arguments,
            _scalar_offsets(recording),
        )
        arch = compile_arch(source, arch)
    flags = ptxas_flags(config.codegen_opt, arch, options)
    product = cache.compile(source, flags, arch)
    llvm_codegen = timings.codegen_time if timings else 0.0
    return CompiledCode(
        product.image, tier, product.key, arch, source, product.codegen_time + llvm_codegen,
        timings.opt_time if timings else 0.0, timings.preprocess_ir_time if timings else 0.0,
        product.cached, product.log,
    )  # fmt: skip


def rewrite_ptx(
    source: str, kernel: str, config: ExperimentConfiguration, args: bytes, scalar_offsets: set[int] | None
) -> str:
    """The PTX tier's rewrites of the recorded PTX for ``config`` (in a fixed order)."""
    out = source
    if config.specialize:
        out = ptxrw.specialize_params(out, kernel, args, scalar_offsets)
    if config.specialize_dims:
        out = ptxrw.specialize_dims(out, kernel, config.grid.as_tuple(), config.block.as_tuple())
    if config.set_launch_bounds:
        grounded = config.ground()
        out = ptxrw.set_launch_bounds(out, kernel, int(grounded.max_threads), grounded.min_blocks_per_sm)
    return out


def compile_arch(ptx: str, device_arch: str) -> str:
    """The architecture to compile ``ptx`` for on a ``device_arch`` GPU.

    PTX whose ``.target`` is the GPU's architecture-specific variant (``sm_90a``:
    Triton's for wgmma on the H100) compiles only for that variant, and its
    cubin runs on that GPU; any other PTX compiles for the GPU itself.
    """
    target = ptxrw.target_arch(ptx)
    if target and target[-1].isalpha() and target[:-1] == device_arch:
        return target
    return device_arch


def ptxas_flags(codegen_opt: int, arch: str, options: CompileOptions = CompileOptions()) -> tuple[str, ...]:
    """The ptxas command-line options for a compile (part of the cache key)."""
    if codegen_opt not in range(0, 5):
        raise ConfigurationError(f"codegen_opt={codegen_opt} must be in 0..4")
    flags = [f"-arch={arch}", f"-O{min(codegen_opt, 3)}"]
    if codegen_opt == 4:
        flags += ["--allow-expensive-optimizations", "true"]
    if options.max_registers is not None:
        flags += ["--maxrregcount", str(options.max_registers)]
    return tuple(flags)


def _scalar_offsets(recording: Any) -> set[int] | None:
    params = recording.kernel.params
    if not params:
        return None
    return {p.offset for p in params if p.kind == "scalar"}


def _cubin_runs_on(recorded_arch: str, device_arch: str) -> bool:
    """SASS runs on the architecture it was built for (and on the same major family's minor revisions)."""
    r, d = recorded_arch.removeprefix("sm_"), device_arch.removeprefix("sm_")
    if r == d:
        return True
    if r[-1:].isalpha() or d[-1:].isalpha():  # sm_90a and friends run only where built
        return False
    return r[:-1] == d[:-1] and int(r[-1]) <= int(d[-1])


def _llvm_ptx(recording: Any, instance: Any, config: ExperimentConfiguration, arch: str) -> tuple[str, Any]:
    """PTX from the recorded bitcode through mneme.llvm, and its phase timings."""
    try:
        from mneme.llvm.compile import (
            compile_to_ptx_timed,  # lazy: llvmlite is an optional dependency
        )
    except ImportError as exc:
        raise CompileError(
            f"the LLVM tier is not available in this installation ({exc}); install mneme[llvm] (llvmlite)"
        ) from None
    grounded = config.ground()
    specialize = None
    if config.specialize:
        offsets = _scalar_offsets(recording)
        specialize = {
            index: instance.arguments[p.offset : p.offset + p.size]
            for index, p in enumerate(recording.kernel.params)
            if p.kind != "pointer" and (offsets is None or p.offset in offsets)
        }
    try:
        return compile_to_ptx_timed(
            recording.load_code("bitcode"),
            kernel=recording.kernel_name,
            passes=config.passes,
            codegen_opt=config.codegen_opt,
            specialize=specialize,
            dims=(config.grid.as_tuple(), config.block.as_tuple()) if config.specialize_dims else None,
            launch_bounds=(grounded.max_threads, grounded.min_blocks_per_sm) if config.set_launch_bounds else None,
            prune=config.prune,
            internalize=config.internalize,
            arch=arch,
        )
    except Exception as exc:  # a bad pipeline, IR that does not compile, unreadable bitcode
        raise CompileError(f"the LLVM tier failed for passes={config.passes!r}: {exc}") from None


# -- PTX compilers and the cache ----------------------------------------------------------


@dataclass(frozen=True)
class _Product:
    image: bytes
    key: str
    codegen_time: float
    cached: bool
    log: str


class PtxCompiler(Protocol):
    """PTX text to a cubin, given ptxas command-line options (``ptxas_flags``)."""

    name: str  # "library" or "ptxas"

    @property
    def identity(self) -> str:
        """The exact compiler (part of the cache key)."""
        ...

    def compile(self, ptx: str, flags: tuple[str, ...]) -> tuple[bytes, str]:
        """(cubin, info log); CompileError with the compiler's diagnostics on failure."""
        ...


@dataclass(frozen=True)
class PtxasProgram:
    """The ``ptxas`` program, one subprocess per compile."""

    path: str
    name = "ptxas"

    @property
    def identity(self) -> str:
        return f"ptxas: {ptxas_version(self.path)}"

    def compile(self, ptx: str, flags: tuple[str, ...]) -> tuple[bytes, str]:
        return run_ptxas(self.path, ptx, flags)


class PtxLibrary:
    """NVIDIA's nvPTXCompiler (ptxas as a library) in this process: ``mneme._ptxcompiler``."""

    name = "library"

    def __init__(self, module: Any):
        self._module = module
        self.identity = module.version()  # origin, full version and archive hash, fixed at build time

    def compile(self, ptx: str, flags: tuple[str, ...]) -> tuple[bytes, str]:
        try:
            return self._module.compile(ptx, library_options(flags))
        except self._module.CompileError as exc:
            raise CompileError(f"nvPTXCompiler {' '.join(flags)} failed: {exc}") from None


def library_options(flags: tuple[str, ...]) -> list[str]:
    """ptxas options as nvPTXCompiler takes them: ``--gpu-name=sm_XX`` for ``-arch=sm_XX`` and
    an option with its value as one token (``--maxrregcount=32``)."""
    out: list[str] = []
    i = 0
    while i < len(flags):
        flag = flags[i]
        if flag.startswith("-arch="):
            out.append("--gpu-name=" + flag.removeprefix("-arch="))
        elif flag.startswith("--") and "=" not in flag and i + 1 < len(flags) and not flags[i + 1].startswith("-"):
            out.append(f"{flag}={flags[i + 1]}")
            i += 1
        else:
            out.append(flag)
        i += 1
    return out


@lru_cache(maxsize=1)
def _library() -> PtxLibrary | str:
    """The in-process compiler, or why there is none (the module was not built or does not load)."""
    try:
        from mneme import _ptxcompiler
    except ImportError as exc:
        return f"mneme._ptxcompiler is not available ({exc})"
    return PtxLibrary(_ptxcompiler)


def ptx_compiler() -> PtxCompiler:
    """The compiler ``$MNEME_PTX_COMPILER`` names (read at each call): ``auto`` (default) is the
    library when ``mneme._ptxcompiler`` imports and ptxas otherwise."""
    choice = os.environ.get(PTX_COMPILER_ENV, "").strip().lower() or "auto"
    if choice not in PTX_COMPILER_CHOICES:
        raise ConfigurationError(
            f"{PTX_COMPILER_ENV}={os.environ[PTX_COMPILER_ENV]!r} is not one of {', '.join(PTX_COMPILER_CHOICES)}"
        )
    if choice != "ptxas":
        library = _library()
        if not isinstance(library, str):
            return library
        if choice == "library":
            raise NotAvailableError(
                f"{PTX_COMPILER_ENV}=library, but {library}: build mneme where libnvptxcompiler_static.a is found "
                "(CUDA toolkit or the nvidia-nvptxcompiler wheel), or use ptxas (unset it)"
            )
    return PtxasProgram(find_ptxas())


_WARM_UP_PTX = ".version 9.0\n.target {arch}\n.address_size 64\n.visible .entry mneme_warm_up()\n{{\n\tret;\n}}\n"


@lru_cache(maxsize=None)
def warm_up(arch: str) -> float:
    """Start the PTX compiler of this process once, on a trivial kernel (nothing is cached), so that the
    first real compile pays only for itself: the library's one-time initialisation or ptxas's first
    start from disk. Seconds taken; a failure is ignored (a real compile
    reports its own)."""
    start = time.perf_counter()
    try:
        ptx_compiler().compile(_WARM_UP_PTX.format(arch=arch), ptxas_flags(BASELINE_CODEGEN_OPT, arch))
    except MnemeError:
        pass
    return time.perf_counter() - start


def find_ptxas() -> str:
    """ptxas from $CUDA_HOME/bin, $PATH, or /usr/local/cuda/bin."""
    candidates = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "bin" / "ptxas")
    found = shutil.which("ptxas")
    if found:
        candidates.append(Path(found))
    candidates.append(Path("/usr/local/cuda/bin/ptxas"))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    raise NotAvailableError(
        "ptxas (CUDA toolkit) not found in $CUDA_HOME/bin, on PATH or in /usr/local/cuda/bin; recompiling "
        "configurations needs it: install the CUDA toolkit or set CUDA_HOME"
    )


def ptxas_version(ptxas: str) -> str:
    return _ptxas_version(ptxas, os.stat(ptxas).st_mtime_ns)


_version_lock = threading.Lock()
_versions: dict[tuple[str, int], str] = {}


def _ptxas_version(ptxas: str, mtime: int) -> str:
    with _version_lock:
        if (ptxas, mtime) not in _versions:
            out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=30)
            _versions[(ptxas, mtime)] = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "unknown"
        return _versions[(ptxas, mtime)]


def default_cache_dir() -> Path:
    return cache_root() / "compile"


class CompileCache:
    """Content-addressed cubins: memory (LRU) in front of a directory.

    The key is SHA-256 over the PTX text, the ptxas flags and the exact
    compiler that made the cubin (the ptxas version, or the library's
    identity), so a changed toolkit never serves stale code. Disk entries are
    written atomically (temporary file, then rename); an unreadable entry is
    ignored and recompiled.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, memory_entries: int = MEMORY_CACHE_ENTRIES):
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self._memory: OrderedDict[str, bytes] = OrderedDict()
        self._memory_entries = memory_entries
        self._lock = threading.Lock()

    def key(self, ptx: str, flags: tuple[str, ...], compiler: str) -> str:
        """The entry of ``ptx`` compiled with ``flags`` by ``compiler`` (a PtxCompiler's identity)."""
        h = hashlib.sha256()
        h.update(json.dumps({"flags": list(flags), "compiler": compiler}, sort_keys=True).encode())
        h.update(b"\0")
        h.update(ptx.encode("utf-8"))
        return h.hexdigest()

    def compile(self, ptx: str, flags: tuple[str, ...], arch: str) -> _Product:
        """The cubin of ``ptx`` (``ptx_compiler()``; a library failure is retried with ptxas where installed)."""
        compiler = ptx_compiler()
        try:
            return self.compile_with(compiler, ptx, flags)
        except CompileError as exc:
            if compiler.name == "ptxas":
                raise
            try:
                ptxas = PtxasProgram(find_ptxas())
            except NotAvailableError:
                raise exc from None
            product = self.compile_with(ptxas, ptx, flags)  # PTX that is wrong: ptxas's CompileError
            return replace(product, log="\n".join(filter(None, [f"{exc}; ptxas compiled it", product.log])))

    def compile_with(self, compiler: PtxCompiler, ptx: str, flags: tuple[str, ...]) -> _Product:
        """The cubin of ``ptx`` from ``compiler``, through the cache (the key names the compiler)."""
        key = self.key(ptx, flags, compiler.identity)
        hit = self._get(key)
        if hit is not None:
            return _Product(hit, key, 0.0, True, "")
        t0 = time.perf_counter()
        image, log = compiler.compile(ptx, flags)
        elapsed = time.perf_counter() - t0
        self._put(key, image)
        return _Product(image, key, elapsed, False, log)

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.cubin"

    def _get(self, key: str) -> bytes | None:
        with self._lock:
            if key in self._memory:
                self._memory.move_to_end(key)
                return self._memory[key]
        try:
            data = self._path(key).read_bytes()
        except OSError:
            return None
        if not data.startswith(b"\x7fELF"):
            return None  # a damaged entry: recompile and overwrite it
        self._remember(key, data)
        return data

    def _put(self, key: str, image: bytes) -> None:
        self._remember(key, image)
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(image)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only or full cache directory costs recompiles, not failures

    def _remember(self, key: str, image: bytes) -> None:
        with self._lock:
            self._memory[key] = image
            self._memory.move_to_end(key)
            while len(self._memory) > self._memory_entries:
                self._memory.popitem(last=False)


def run_ptxas(ptxas: str, ptx: str, flags: tuple[str, ...]) -> tuple[bytes, str]:
    """Compile PTX text to a cubin with ``ptxas``; CompileError with its diagnostics on failure."""
    with tempfile.TemporaryDirectory(prefix="mneme-ptxas-") as tmp:
        src, out = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        src.write_text(ptx, encoding="utf-8")
        try:
            proc = subprocess.run(
                [ptxas, *flags, "-o", str(out), str(src)], capture_output=True, text=True, timeout=PTXAS_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise CompileError(f"ptxas {' '.join(flags)} ran longer than {PTXAS_TIMEOUT_S:.0f} s") from None
        log = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            raise CompileError(f"ptxas {' '.join(flags)} failed: {log or 'exit status ' + str(proc.returncode)}")
        return out.read_bytes(), log


_default_cache: CompileCache | None = None
_default_lock = threading.Lock()


def default_cache() -> CompileCache:
    """The process-wide cache (directory from $MNEME_CACHE_DIR at first use)."""
    global _default_cache
    with _default_lock:
        if _default_cache is None:
            _default_cache = CompileCache()
        return _default_cache
