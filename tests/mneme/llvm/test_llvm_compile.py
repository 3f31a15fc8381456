"""compile_to_ptx: pipelines, specialization, launch bounds, errors; ptxas checks the PTX (no GPU)."""

from __future__ import annotations

import re
import struct

import pytest
from llvm_test_support import ptxas_check

from mneme.errors import ArtifactError, ConfigurationError
from mneme.llvm import compile_to_ptx, compile_to_ptx_timed, load
from mneme.llvm.pipeline import NAMED_PASSES, parse_pipeline

pytestmark = pytest.mark.usefixtures("llvmlite_available")

STENCIL = "_Z7stencilPKdPdii"
SAXPY = "_Z5saxpyifPKfPf"
WAVE = "_Z4waveiPKfPf"
AFFINE = "_Z6affine6AffinePf6float4"
ROWSUM = "_ZL6rowsumiiPKfPf"  # static: clang keeps the internal-linkage L, nvcc drops it
DEFAULT_PIPELINES = [f"default<{lvl}>" for lvl in ("O0", "O1", "O2", "O3", "Os", "Oz")]


def _entry(ptx: str) -> str:
    return ptx[ptx.index(".entry") :]


@pytest.mark.parametrize("passes", DEFAULT_PIPELINES + ["sroa,instcombine,simplifycfg", "function(sroa,newgvn),default<O1>"])
@pytest.mark.parametrize("kernel", [SAXPY, WAVE, STENCIL, AFFINE, ROWSUM])
def test_every_pipeline_gives_ptx_ptxas_accepts(vecops_records, ptxas, tmp_path, kernel, passes):
    ptx, timings = compile_to_ptx_timed(vecops_records[kernel], kernel=kernel, passes=passes)
    assert f".entry {kernel}(" in ptx and ".target sm_90" in ptx
    assert min(timings.preprocess_ir_time, timings.opt_time, timings.codegen_time) > 0
    proc = ptxas_check(ptx, tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_pipelines_differ(vecops_records):
    bitcode = vecops_records[STENCIL]
    # codegen_opt=0: the NVPTX back end's own IR clean-up (SROA, CSE) would hide the difference
    o0 = compile_to_ptx(bitcode, kernel=STENCIL, passes="default<O0>", codegen_opt=0)
    o3 = compile_to_ptx(bitcode, kernel=STENCIL, passes="default<O3>", codegen_opt=0)
    assert len(_entry(o3)) < len(_entry(o0))
    assert "local" in _entry(o0) and "local" not in _entry(o3)  # O0 keeps the front end's stack slots
    assert _entry(o3).count("bra") < _entry(o0).count("bra")  # O3 merged the bounds checks


def test_size_levels_give_smaller_code_than_o2(vecops_records):
    """default<Os>/<Oz> keep rowsum's 8-step loop that O2 unrolls fully: fewer IR instructions and loads."""
    module = load(vecops_records[ROWSUM], kernel=ROWSUM)
    o2 = module.optimize("default<O2>").opcode_histogram()
    ptx_o2 = _entry(compile_to_ptx(vecops_records[ROWSUM], kernel=ROWSUM, passes="default<O2>"))
    for level in ("Os", "Oz"):
        sized = module.optimize(f"default<{level}>").opcode_histogram()
        assert sum(sized.values()) < sum(o2.values()), (level, sized, o2)
        assert sized["load"] < o2["load"], (level, sized, o2)  # the loop's loads stay in the loop
        ptx = _entry(compile_to_ptx(vecops_records[ROWSUM], kernel=ROWSUM, passes=f"default<{level}>"))
        assert ptx != ptx_o2 and ptx.count("\n") <= ptx_o2.count("\n"), level


def test_size_levels_mark_functions_and_keep_the_kernel_valid(vecops_records):
    for level, attributes in (("Os", {"optsize"}), ("Oz", {"optsize", "minsize"})):
        text = load(vecops_records[ROWSUM], kernel=ROWSUM).optimize(f"default<{level}>").text
        groups = re.findall(r"^attributes #\d+ = \{([^}]*)\}", text, re.MULTILINE)
        assert any(attributes <= set(g.split()) for g in groups), (level, groups)


def test_specializing_arguments_folds_them(vecops_records, ptxas, tmp_path):
    bitcode = vecops_records[STENCIL]
    plain = compile_to_ptx(bitcode, kernel=STENCIL)
    nx, ny = struct.pack("<i", 256), struct.pack("<i", 128)
    special = compile_to_ptx(bitcode, kernel=STENCIL, specialize={2: nx, 3: ny})
    assert _entry(plain).count("ld.param") == 4
    assert _entry(special).count("ld.param") == 2  # only the two pointers are still loaded
    # the bounds 0 < x < nx - 1, 0 < y < ny - 1 became immediates (as x - 1 > 253, y - 1 > 125)
    assert re.search(r"setp\.\w+\.[su]32\s+%p\d+, %r\d+, 253;", special)
    assert re.search(r"setp\.\w+\.[su]32\s+%p\d+, %r\d+, 125;", special)
    # the launch ABI does not change: the entry keeps all four parameters
    assert _entry(special).split(")")[0].count(".param") == 4
    assert ptxas_check(special, tmp_path).returncode == 0


def test_specializing_floats_and_pointers(vecops_records, ptxas, tmp_path):
    bitcode = vecops_records[SAXPY]
    ptx = compile_to_ptx(
        bitcode,
        kernel=SAXPY,
        specialize={0: struct.pack("<i", 4096), 1: struct.pack("<f", 2.5), 2: struct.pack("<Q", 0x7F0000000000)},
    )
    body = _entry(ptx)
    assert body.count("ld.param") == 1  # only y
    assert "0f40200000" in body  # 2.5f as an immediate
    assert "139637976727552" in body or "0x7f0000000000" in body.lower()  # the recorded pointer
    assert ptxas_check(ptx, tmp_path).returncode == 0


def test_specializing_byval_structs_and_vectors(vecops_records, ptxas, tmp_path):
    affine = struct.pack("<ifd", 100, 2.5, 0.5)  # struct Affine {int n; float scale; double shift;}
    bias = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)  # float4
    ptx = compile_to_ptx(vecops_records[AFFINE], kernel=AFFINE, specialize={0: affine, 2: bias})
    body = _entry(ptx)
    assert body.count("ld.param") == 1  # only y; the struct and the vector are constants now
    assert ", 99;" in body  # i < p.n with n = 100
    assert "0f40200000" in body and "0f3F000000" in body and "0f3F800000" in body  # 2.5, 0.5, 1.0
    assert "_param_0[16]" in body and "_param_2[16]" in body  # the launch ABI is unchanged
    assert ptxas_check(ptx, tmp_path).returncode == 0
    with pytest.raises(ConfigurationError, match="16 bytes"):
        compile_to_ptx(vecops_records[AFFINE], kernel=AFFINE, specialize={0: affine[:8]})


def test_specialize_dims_and_launch_bounds(vecops_records, ptxas, tmp_path):
    bitcode = vecops_records[SAXPY]
    ptx = compile_to_ptx(bitcode, kernel=SAXPY, dims=((256, 1, 1), (256, 1, 1)), launch_bounds=(256, 4))
    body = _entry(ptx)
    assert "%ntid.x" not in body and "shl.b32" in body  # blockIdx.x * 256 became a shift
    assert ".maxntid 256" in ptx and ".minnctapersm 4" in ptx
    assert ptxas_check(ptx, tmp_path).returncode == 0
    unbounded = compile_to_ptx(bitcode, kernel=SAXPY)
    assert "%ntid.x" in _entry(unbounded) and ".maxntid" not in unbounded


def test_prune_and_internalize(vecops_records, llvmlite_available):
    import llvmlite.binding as llvm

    def expose_helper(module):  # as if the helper were an external device function
        module.get_function("_ZL4sinff").linkage = llvm.Linkage.external

    module = load(vecops_records[WAVE]).apply(expose_helper)
    module = module.transform(lambda ir: ir + "\ndefine internal void @unused_helper() {\n  ret void\n}\n")
    both = module.to_ptx(passes="sroa")
    neither = module.to_ptx(passes="sroa", prune=False, internalize=False)
    assert ".visible .func  (.param .b32 func_retval0) _ZL4sinff" in neither
    assert ".visible .func" not in both and "_ZL4sinff" in both  # internal now, still called
    assert "unused_helper" in neither and "unused_helper" not in both
    for ptx in (both, neither):  # device variables keep their names (the replay restores them)
        assert re.search(r"\.global .*\blaunches\b", ptx) and "weights" in ptx


def test_retargeting_to_another_architecture(vecops_records, ptxas, tmp_path):
    ptx = compile_to_ptx(vecops_records[WAVE], kernel=WAVE, arch="sm_80")
    assert ".target sm_80" in ptx
    assert ptxas_check(ptx, tmp_path, arch="sm_80").returncode == 0


def test_codegen_opt_levels(vecops_records):
    ptx = {level: compile_to_ptx(vecops_records[SAXPY], kernel=SAXPY, codegen_opt=level) for level in range(5)}
    assert _entry(ptx[0]).count("bra") > _entry(ptx[3]).count("bra")
    assert ptx[4] == ptx[3]  # LLVM's code generator stops at 3; 4 matters to the driver JIT only
    with pytest.raises(ConfigurationError, match="codegen_opt"):
        compile_to_ptx(vecops_records[SAXPY], kernel=SAXPY, codegen_opt=7)


def test_unknown_pass_is_a_clear_error(vecops_records):
    with pytest.raises(ConfigurationError, match=r"unknown pass 'no-such-pass'.*default<O0\|O1"):
        compile_to_ptx(vecops_records[SAXPY], kernel=SAXPY, passes="sroa,no-such-pass")
    with pytest.raises(ConfigurationError, match=r"'gvn'.*llvmlite does not expose.*newgvn"):
        parse_pipeline("gvn")
    with pytest.raises(ConfigurationError, match="unknown optimization level 'O9'"):
        parse_pipeline("default<O9>")
    with pytest.raises(ConfigurationError, match="unbalanced"):
        parse_pipeline("function(sroa")
    with pytest.raises(ConfigurationError, match="must name a pipeline"):
        parse_pipeline("  ")


def test_every_named_pass_runs(vecops_records):
    for name in NAMED_PASSES:
        if name in ("loop-extract", "strip"):
            continue  # valid, but they change the module's shape (outlined loops, no names)
        assert ".entry" in compile_to_ptx(vecops_records[STENCIL], kernel=STENCIL, passes=name), name


def test_bad_inputs(vecops_records):
    with pytest.raises(ConfigurationError, match=r"kernel '_Z4nopev' is not in the IR; it defines _Z5saxpy"):
        compile_to_ptx(vecops_records[SAXPY], kernel="_Z4nopev")
    with pytest.raises(ArtifactError, match="not readable LLVM bitcode"):
        compile_to_ptx(b"BC\xc0\xde garbage", kernel=SAXPY)
    with pytest.raises(ConfigurationError, match="parameter 9 .* it has 4 parameters"):
        compile_to_ptx(vecops_records[SAXPY], kernel=SAXPY, specialize={9: b"\0" * 4})
    with pytest.raises(ConfigurationError, match=r"parameter 0 of .* is i32 \(4 bytes\) but the recorded value has 8"):
        compile_to_ptx(vecops_records[SAXPY], kernel=SAXPY, specialize={0: b"\0" * 8})
    with pytest.raises(ConfigurationError, match="arch='gfx90a'"):
        compile_to_ptx(vecops_records[SAXPY], kernel=SAXPY, arch="gfx90a")


@pytest.mark.parametrize("nvcc_name", [
    "_Z6rowsumiiPKfPf",  # whole-program build
    "__nv_static_30__8c1b6f2a_9_vecops_cu_5d3e7a11__Z6rowsumiiPKfPf",  # -rdc: nvcc prefixes the file
])
def test_static_kernels_take_the_recorded_nvcc_name(vecops_records, ptxas, tmp_path, nvcc_name):
    ptx = compile_to_ptx(vecops_records[ROWSUM], kernel=nvcc_name, passes="default<Os>")
    assert f".visible .entry {nvcc_name}(" in ptx
    assert ptxas_check(ptx, tmp_path).returncode == 0
    assert load(vecops_records[ROWSUM], kernel=nvcc_name).kernel == ROWSUM


def test_static_kernel_names_in_namespaces_and_templates():
    from mneme.llvm.names import canonical_name, same_kernel

    assert same_kernel("_ZN2ns5scaleEPf", "_ZN2nsL5scaleEPf")  # nvcc, clang
    assert same_kernel("__nv_static_27__2c130fac_6_st3_cu_d589cb60__Z2tkILi3EEvPf", "_ZL2tkILi3EEvPf")
    assert not same_kernel("_Z5scalePf", "_ZL5scalePi")
    assert canonical_name("_ZN3fooL5scaleEPf") == "_ZN3foo5scaleEPf"
    for inside in ("_Z4fooLPf", "_ZN4fooL5scaleEPf"):  # the L of the identifier fooL is not a marker
        assert canonical_name(inside) == inside


def test_libdevice_is_linked_for_new_math_calls(vecops_records, ptxas, tmp_path):
    module = load(vecops_records[SAXPY])

    def use_expf(ir: str) -> str:
        ir = ir.replace("fmul contract float", "call float @__nv_expf(float", 1)
        ir = re.sub(r"(call float @__nv_expf\(float [^,]+), ([^\n]+)", r"\1)", ir, count=1)
        return ir + "\ndeclare float @__nv_expf(float)\n"

    ptx = module.transform(use_expf).to_ptx()
    assert "ex2.approx" in ptx  # libdevice's expf
    assert ptxas_check(ptx, tmp_path).returncode == 0


def test_anonymous_namespace_kernels_take_the_recorded_nvcc_name(vecops_records, ptxas, tmp_path):
    clang_name = "_ZN12_GLOBAL__N_15saxpyEifPKfPf"  # what clang calls a kernel in an anonymous namespace
    nvcc_name = "_ZN33_GLOBAL__N__ba903b16_5_cg_cu_main5saxpyEifPKfPf"  # what the launch (nvcc) calls it
    anonymous = load(vecops_records[SAXPY]).transform(
        lambda ir: ir.replace(f"define dso_local ptx_kernel void @{SAXPY}", f"define internal ptx_kernel void @{clang_name}")
        .replace(f"@{SAXPY}", f"@{clang_name}")
    )
    assert anonymous.kernels == [clang_name]
    ptx = compile_to_ptx(anonymous.bitcode, kernel=nvcc_name, specialize={0: struct.pack("<i", 64)})
    assert f".visible .entry {nvcc_name}(" in ptx  # the name cuModuleGetFunction will look up
    assert ptxas_check(ptx, tmp_path).returncode == 0
    module = load(anonymous.bitcode, kernel=nvcc_name)
    assert module.kernel == clang_name and f".entry {nvcc_name}(" in module.to_ptx()
    with pytest.raises(ConfigurationError, match="is not in the IR"):
        compile_to_ptx(anonymous.bitcode, kernel="_ZN33_GLOBAL__N__ba903b16_5_cg_cu_main4waveEv")


def test_launch_bounds_as_nvvm_annotations_for_older_llvm(vecops_records):
    """LLVM < 21 reads launch bounds from nvvm.annotations; LLVM 22 upgrades them on parse."""
    from mneme.llvm import _binding, ir_text

    text = str(_binding.parse_bitcode(vecops_records[SAXPY]))
    annotated = ir_text.add_launch_bounds(text, SAXPY, 128, 3, attributes=False)
    assert '!"maxntidx", i32 128' in annotated and '!"minctasm", i32 3' in annotated
    module = _binding.parse_assembly(annotated)
    ptx = _binding.target_machine("sm_90", "+ptx85,+sm_90", 3).emit_assembly(module)
    assert ".maxntid 128" in ptx and ".minnctapersm 3" in ptx


def test_concurrent_compiles_from_threads(vecops_records):
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(k, p) for k in (SAXPY, STENCIL) for p in DEFAULT_PIPELINES]
    serial = [compile_to_ptx(vecops_records[k], kernel=k, passes=p) for k, p in jobs]
    with ThreadPoolExecutor(4) as pool:
        parallel = list(pool.map(lambda job: compile_to_ptx(vecops_records[job[0]], kernel=job[0], passes=job[1]), jobs))
    assert parallel == serial  # deterministic, and no shared state between threads
