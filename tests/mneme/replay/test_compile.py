"""compile_for: which knobs recompile, ptxas options, the content cache, and its errors (CPU only)."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

import mneme.testing.synthetic_recordings as synth
from mneme.errors import ConfigurationError
from mneme.model.experiment import ExperimentConfiguration
from mneme.recording.execution import RecordedExecution
from mneme.replay import compile as cmp

needs_ptxas = pytest.mark.skipif(
    not any(Path(p).is_file() for p in [shutil.which("ptxas") or "", "/usr/local/cuda/bin/ptxas"]),
    reason="ptxas (CUDA toolkit) not installed",
)


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    path = synth.vecadd(tmp_path_factory.mktemp("rec"), n=4096)
    rec = RecordedExecution.from_json(str(path))
    return rec, rec.single_instance()


@pytest.fixture
def cache(tmp_path):
    return cmp.CompileCache(tmp_path / "cache")


def baseline(inst) -> ExperimentConfiguration:
    return ExperimentConfiguration(grid=inst.grid_dim, block=inst.block_dim, shared_mem=inst.shared_mem)


def test_which_knobs_recompile(recording):
    _, inst = recording
    base = baseline(inst)
    assert not cmp.needs_recompile(base)
    assert not cmp.needs_recompile(base.replace(block={"x": 512}, grid={"x": 8}, shared_mem=1024))
    for change in ({"codegen_opt": 0}, {"specialize": True}, {"specialize_dims": True},
                   {"set_launch_bounds": True}, {"passes": "default<O1>"}):  # fmt: skip
        assert cmp.needs_recompile(base.replace(**change)), change
    assert cmp.needs_recompile(base, cmp.CompileOptions(max_registers=32))


def test_baseline_is_the_recorded_cubin_byte_for_byte(recording, cache):
    rec, inst = recording
    code = cmp.compile_for(rec, inst, baseline(inst), "sm_90", cache=cache)
    assert code.tier == "recorded" and code.image == rec.load_code("cubin") and code.ptx is None
    assert pickle.loads(pickle.dumps(code)) == code  # crosses process boundaries


def test_ptxas_flags():
    assert cmp.ptxas_flags(0, "sm_90") == ("-arch=sm_90", "-O0")
    assert cmp.ptxas_flags(4, "sm_90", cmp.CompileOptions(max_registers=32)) == (
        "-arch=sm_90", "-O3", "--allow-expensive-optimizations", "true", "--maxrregcount", "32",
    )  # fmt: skip
    with pytest.raises(ConfigurationError):
        cmp.ptxas_flags(5, "sm_90")
    with pytest.raises(ConfigurationError, match="16..255"):
        cmp.CompileOptions(max_registers=8)


def test_cubin_compatibility():
    assert cmp._cubin_runs_on("sm_90", "sm_90")
    assert cmp._cubin_runs_on("sm_80", "sm_86") and not cmp._cubin_runs_on("sm_86", "sm_80")
    assert not cmp._cubin_runs_on("sm_90", "sm_100") and not cmp._cubin_runs_on("sm_90a", "sm_90")


@needs_ptxas
def test_knobs_recompile_the_rewritten_ptx_and_cache_it(recording, cache, tmp_path):
    rec, inst = recording
    config = baseline(inst).replace(codegen_opt=1, specialize=True, set_launch_bounds=True, max_threads=256)
    first = cmp.compile_for(rec, inst, config, "sm_90", cache=cache)
    assert first.tier == "ptx" and first.image.startswith(b"\x7fELF") and not first.cached
    assert ".maxntid 256, 1, 1" in first.ptx and "mov.u32 %r2, 4096;" in first.ptx
    again = cmp.compile_for(rec, inst, config, "sm_90", cache=cache)
    assert again.cached and again.image == first.image and again.key == first.key and again.codegen_time == 0
    # A fresh process (new cache object, same directory) finds it on disk.
    disk = cmp.compile_for(rec, inst, config, "sm_90", cache=cmp.CompileCache(cache.directory))
    assert disk.cached and disk.image == first.image
    # Different code options, different key and product.
    other = cmp.compile_for(rec, inst, config.replace(codegen_opt=0), "sm_90", cache=cache)
    assert other.key != first.key and other.image != first.image


@needs_ptxas
def test_a_damaged_cache_entry_is_recompiled(recording, cache):
    rec, inst = recording
    config = baseline(inst).replace(codegen_opt=2)
    first = cmp.compile_for(rec, inst, config, "sm_90", cache=cache)
    path = cache._path(first.key)
    path.write_bytes(b"garbage")
    fresh = cmp.CompileCache(cache.directory)
    again = cmp.compile_for(rec, inst, config, "sm_90", cache=fresh)
    assert not again.cached and again.image == first.image
    assert path.read_bytes() == first.image  # repaired


@needs_ptxas
def test_ptxas_errors_are_compile_errors():
    ptxas = cmp.find_ptxas()
    with pytest.raises(cmp.CompileError, match="ptxas .* failed"):
        cmp.run_ptxas(ptxas, ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k() { bogus; }", ("-arch=sm_90",))


def test_llvm_tier_needs_bitcode(recording, cache):
    rec, inst = recording
    with pytest.raises(cmp.CompileError, match="no LLVM bitcode.*mneme config cxx"):
        cmp.compile_for(rec, inst, baseline(inst).replace(passes="default<O2>"), "sm_90", cache=cache)


def test_invalid_configuration_is_refused_before_any_work(recording, cache):
    rec, inst = recording
    with pytest.raises(ConfigurationError, match="invalid configuration"):
        cmp.compile_for(rec, inst, ExperimentConfiguration.from_dict({"block": {"x": 4096}}), "sm_90", cache=cache)


def test_missing_ptxas_says_what_to_install(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(cmp, "Path", _NoCudaPath)
    with pytest.raises(Exception, match="install the CUDA toolkit or set CUDA_HOME"):
        cmp.find_ptxas()


class _NoCudaPath(type(Path())):
    def is_file(self) -> bool:  # every candidate is missing
        return False


_SM90A_PTX = ".version 8.0\n.target sm_90a\n.address_size 64\n.visible .entry k()\n{\n\tret;\n}\n"


def test_ptx_for_the_gpus_architecture_specific_variant_compiles_for_that_variant():
    assert cmp.compile_arch(_SM90A_PTX, "sm_90") == "sm_90a"  # Triton's PTX on an H100
    assert cmp.compile_arch(_SM90A_PTX, "sm_100") == "sm_100"  # another GPU: the compile says why it fails
    assert cmp.compile_arch(_SM90A_PTX.replace("sm_90a", "sm_80"), "sm_90") == "sm_90"


@needs_ptxas
def test_sm_90a_ptx_compiles_where_plain_sm_90_is_refused():
    ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    with pytest.raises(cmp.CompileError, match="sm_90a"):
        cmp.run_ptxas(ptxas, _SM90A_PTX, cmp.ptxas_flags(3, "sm_90"))
    image, _ = cmp.run_ptxas(ptxas, _SM90A_PTX, cmp.ptxas_flags(3, cmp.compile_arch(_SM90A_PTX, "sm_90")))
    assert image[:4] == b"\x7fELF"
