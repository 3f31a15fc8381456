"""The PTX compilers of the PTX tier: nvPTXCompiler in-process (mneme._ptxcompiler) and ptxas (CPU only).

The library must give ptxas's cubin for every option set ``ptxas_flags`` makes;
``$MNEME_PTX_COMPILER`` chooses; the cache key names the compiler used; a
library failure falls back to ptxas.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from mneme.errors import ConfigurationError, NotAvailableError
from mneme.llvm.elf import read_section, section_names
from mneme.replay import compile as cmp
from mneme.testing import vecadd_code
from mneme.testing.synthetic_recordings import DATA

KERNELS_PTX = (DATA / "kernels.ptx").read_text()
BAD_PTX = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k() { bogus; }"
TKINFO = ".note.nv.tkinfo"

HAS_PTXAS = any(Path(p).is_file() for p in [shutil.which("ptxas") or "", "/usr/local/cuda/bin/ptxas"])
needs_ptxas = pytest.mark.skipif(not HAS_PTXAS, reason="ptxas (CUDA toolkit) not installed")
_LIBRARY = cmp._library()
needs_library = pytest.mark.skipif(
    isinstance(_LIBRARY, str),
    reason=f"{_LIBRARY}: this build found no libnvptxcompiler_static.a (CUDA toolkit or nvidia-nvptxcompiler wheel)",
)

VARIANTS = [
    cmp.ptxas_flags(opt, "sm_90", cmp.CompileOptions(max_registers=regs))
    for opt, regs in itertools.product(range(5), (None, 32))
]


@pytest.fixture
def cache(tmp_path):
    return cmp.CompileCache(tmp_path / "cache")


@pytest.fixture
def use(monkeypatch):
    """use("ptxas"|"library"|"auto"): set $MNEME_PTX_COMPILER for the test."""
    return lambda choice: monkeypatch.setenv(cmp.PTX_COMPILER_ENV, choice)


def _tkinfo_fields(cubin: bytes) -> list[bytes]:
    """The tool-kit note's strings: tool, version, build, the options as parsed."""
    note = read_section(cubin, TKINFO)
    assert note is not None
    return [f for f in note.split(b"\0") if f.isascii() and len(f) > 3][1:]


def test_library_option_spelling():
    flags = cmp.ptxas_flags(4, "sm_90", cmp.CompileOptions(max_registers=32))
    assert cmp.library_options(flags) == [
        "--gpu-name=sm_90", "-O3", "--allow-expensive-optimizations=true", "--maxrregcount=32",
    ]  # fmt: skip
    assert cmp.library_options(cmp.ptxas_flags(0, "sm_100a")) == ["--gpu-name=sm_100a", "-O0"]


@needs_library
@needs_ptxas
@pytest.mark.parametrize("flags", VARIANTS, ids=" ".join)
@pytest.mark.parametrize("ptx", [vecadd_code.PTX, KERNELS_PTX], ids=["vecadd", "kernels"])
def test_library_cubin_is_ptxas_cubin(ptx, flags):
    library, _ = _LIBRARY.compile(ptx, flags)
    ptxas, _ = cmp.PtxasProgram(cmp.find_ptxas()).compile(ptx, flags)
    assert section_names(library) == section_names(ptxas)
    differ = [n for n in section_names(ptxas) if read_section(library, n) != read_section(ptxas, n)]
    assert differ in ([], [TKINFO])
    # The note differs only in the build string: same tool, same version, same options as parsed.
    lib_note, ptxas_note = _tkinfo_fields(library), _tkinfo_fields(ptxas)
    assert lib_note[0] == ptxas_note[0] == b"ptxas" and lib_note[1] == ptxas_note[1]
    assert lib_note[3:] == ptxas_note[3:] and b"-arch sm_90" in ptxas_note[3]


@needs_library
def test_library_module_errors_carry_the_log():
    from mneme import _ptxcompiler

    with pytest.raises(_ptxcompiler.CompileError) as raised:
        _ptxcompiler.compile(BAD_PTX, ["--gpu-name=sm_90"])
    assert raised.value.status == "NVPTXCOMPILE_ERROR_COMPILATION_FAILURE"
    assert "bogus" in raised.value.log and raised.value.log in str(raised.value)
    with pytest.raises(TypeError):
        _ptxcompiler.compile(42, [])
    # Identity for the cache key: API version, origin, full version, archive hash.
    assert _ptxcompiler.version().startswith("nvPTXCompiler ") and "sha256:" in _ptxcompiler.version()


@needs_library
def test_library_info_log(use):
    cubin, log = _LIBRARY.compile(vecadd_code.PTX, ("-arch=sm_90", "-O3", "-v"))
    assert cubin.startswith(b"\x7fELF") and "Compiling entry function '_Z6vecaddPKfS0_Pfi' for 'sm_90'" in log


@needs_library
@pytest.mark.parametrize("reporter", ["ptxas", "nvPTXCompiler"])
def test_bad_ptx_is_a_compile_error_with_the_log(cache, use, monkeypatch, reporter):
    """The library's failure goes to ptxas where installed (its error is the one reported), else it is reported."""
    use("library")
    if reporter == "ptxas" and not HAS_PTXAS:
        pytest.skip("ptxas (CUDA toolkit) not installed")
    if reporter == "nvPTXCompiler":
        monkeypatch.setattr(cmp, "find_ptxas", _no_ptxas)
    with pytest.raises(cmp.CompileError, match=rf"{reporter} -arch=sm_90 -O3 failed: .*bogus"):
        cache.compile(BAD_PTX, cmp.ptxas_flags(3, "sm_90"), "sm_90")


@needs_library
def test_library_needs_no_ptxas(cache, use, monkeypatch):
    use("auto")
    monkeypatch.setattr(cmp, "find_ptxas", _no_ptxas)
    monkeypatch.setattr(cmp, "run_ptxas", _no_ptxas)
    product = cache.compile(vecadd_code.PTX, cmp.ptxas_flags(1, "sm_90"), "sm_90")
    assert product.image.startswith(b"\x7fELF") and not product.cached and product.codegen_time > 0
    assert cache.compile(vecadd_code.PTX, cmp.ptxas_flags(1, "sm_90"), "sm_90").cached


@needs_ptxas
def test_ptxas_choice_runs_the_subprocess(cache, use, monkeypatch):
    use("ptxas")
    monkeypatch.setattr(cmp, "_library", _library_must_not_load)
    calls = []
    real = cmp.run_ptxas
    monkeypatch.setattr(cmp, "run_ptxas", lambda *a: calls.append(a) or real(*a))
    assert cmp.ptx_compiler().name == "ptxas"
    product = cache.compile(vecadd_code.PTX, cmp.ptxas_flags(2, "sm_90"), "sm_90")
    assert len(calls) == 1 and product.image.startswith(b"\x7fELF")


@needs_library
@needs_ptxas
def test_cache_key_names_the_compiler(cache, use):
    flags = cmp.ptxas_flags(0, "sm_90")
    use("ptxas")
    by_ptxas = cache.compile(vecadd_code.PTX, flags, "sm_90")
    use("library")
    by_library = cache.compile(vecadd_code.PTX, flags, "sm_90")
    assert by_library.key != by_ptxas.key and not by_library.cached  # not served ptxas's entry
    assert by_library.key == cache.key(vecadd_code.PTX, flags, _LIBRARY.identity)
    assert by_ptxas.key == cache.key(vecadd_code.PTX, flags, cmp.PtxasProgram(cmp.find_ptxas()).identity)


@needs_ptxas
def test_without_the_module_auto_uses_ptxas(cache, use, monkeypatch):
    monkeypatch.setattr(cmp, "_library", lambda: "mneme._ptxcompiler is not available (No module named ...)")
    use("auto")
    assert cmp.ptx_compiler().name == "ptxas"
    assert cache.compile(vecadd_code.PTX, cmp.ptxas_flags(3, "sm_90"), "sm_90").image.startswith(b"\x7fELF")
    use("library")
    with pytest.raises(NotAvailableError, match="MNEME_PTX_COMPILER=library, but mneme._ptxcompiler is not available"):
        cmp.ptx_compiler()


def test_unknown_choice_is_refused(use):
    use("nvcc")
    with pytest.raises(ConfigurationError, match="MNEME_PTX_COMPILER='nvcc' is not one of auto, library, ptxas"):
        cmp.ptx_compiler()


@needs_ptxas
def test_a_library_failure_falls_back_to_ptxas(cache, use, monkeypatch):
    """A library problem never fails a configuration ptxas compiles; the log says what happened."""

    class Refused(RuntimeError):
        pass

    def refuse(ptx, options):
        raise Refused("NVPTXCOMPILE_ERROR_INTERNAL: something broke")

    broken = cmp.PtxLibrary(SimpleNamespace(compile=refuse, CompileError=Refused, version=lambda: "broken 0.0"))
    monkeypatch.setattr(cmp, "_library", lambda: broken)
    use("auto")
    flags = cmp.ptxas_flags(3, "sm_90")
    product = cache.compile(vecadd_code.PTX, flags, "sm_90")
    expected, _ = cmp.PtxasProgram(cmp.find_ptxas()).compile(vecadd_code.PTX, flags)
    assert product.image == expected
    assert product.key == cache.key(vecadd_code.PTX, flags, cmp.PtxasProgram(cmp.find_ptxas()).identity)
    assert "nvPTXCompiler -arch=sm_90 -O3 failed: NVPTXCOMPILE_ERROR_INTERNAL" in product.log
    assert "ptxas compiled it" in product.log


def _no_ptxas(*_args):
    raise NotAvailableError("ptxas (CUDA toolkit) not found")


def _library_must_not_load():
    raise AssertionError("MNEME_PTX_COMPILER=ptxas must not load the library")


@pytest.mark.parametrize("choice", [pytest.param("ptxas", marks=needs_ptxas), pytest.param("library", marks=needs_library)])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100"])
def test_the_warm_up_kernel_compiles(use, choice, arch):
    """warm_up ignores failures, so its kernel is checked here: a warm-up that failed would warm nothing."""
    use(choice)
    cubin, _ = cmp.ptx_compiler().compile(cmp._WARM_UP_PTX.format(arch=arch), cmp.ptxas_flags(3, arch))
    assert cubin.startswith(b"\x7fELF")
