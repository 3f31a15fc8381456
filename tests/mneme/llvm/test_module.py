"""mneme.llvm.load and IRModule: reading and transforming recorded IR in Python."""

from __future__ import annotations

import json

import pytest

from mneme.errors import ArtifactError, ConfigurationError
from mneme.llvm import IRModule, load

pytestmark = pytest.mark.usefixtures("llvmlite_available")

SAXPY = "_Z5saxpyifPKfPf"
STENCIL = "_Z7stencilPKdPdii"


def test_read_functions_blocks_instructions(vecops_records):
    module = load(vecops_records[STENCIL])
    assert module.kernel == STENCIL and module.kernels == [STENCIL]
    kernel = module.function(STENCIL)
    assert [str(a.type) for a in kernel.arguments] == ["ptr", "ptr", "i32", "i32"]
    blocks = list(kernel.blocks)
    assert len(blocks) >= 2
    opcodes = [inst.opcode for block in blocks for inst in block.instructions]
    assert opcodes[-1] == "ret" and "fadd" in opcodes and "icmp" in opcodes
    histogram = module.opcode_histogram()
    assert histogram["fadd"] == opcodes.count("fadd")
    assert {fn.name for fn in module.defined_functions()} >= {STENCIL}
    with pytest.raises(ConfigurationError, match="no function"):
        module.function("nope")


def test_load_sources(vecops_records, tmp_path):
    bc = tmp_path / "k.bc"
    bc.write_bytes(vecops_records[SAXPY])
    assert load(bc).kernel == SAXPY
    # a recording database: RecordedIR_<static>.bc beside <static>.json
    (tmp_path / "1234.json").write_text(json.dumps({"static_hash": "1234"}))
    (tmp_path / "RecordedIR_1234.bc").write_bytes(vecops_records[SAXPY])
    assert load(tmp_path / "1234.json").kernel == SAXPY
    (tmp_path / "99.json").write_text("{}")
    with pytest.raises(ArtifactError, match="RecordedIR_99.bc is missing.*PTX tier"):
        load(tmp_path / "99.json")
    with pytest.raises(ArtifactError, match="does not exist"):
        load(tmp_path / "absent.bc")
    with pytest.raises(ConfigurationError, match="kernel 'x' is not in"):
        load(bc, kernel="x")


def test_load_from_an_instrumented_executable(vecops_app):
    assert load(vecops_app, kernel=SAXPY).kernel == SAXPY
    with pytest.raises(ConfigurationError, match="name the kernel"):
        load(vecops_app)
    with pytest.raises(ArtifactError, match="no LLVM IR for kernel '_Z3foov'"):
        load(vecops_app, kernel="_Z3foov")


def test_transformations_give_new_modules(vecops_records):
    module = load(vecops_records[SAXPY])
    original_text = module.text
    doubled = module.transform(lambda ir: ir.replace("fmul contract float", "fadd contract float"))
    assert "fadd contract float" in doubled.text and module.text == original_text  # the original is unchanged
    ptx = doubled.to_ptx(passes="default<O3>")
    assert ".entry _Z5saxpyifPKfPf" in ptx and "mul.f32" not in ptx[ptx.index(".entry") :]
    with pytest.raises(ConfigurationError, match="not valid LLVM IR"):
        module.transform(lambda ir: ir.replace("ret void", "ret i32 7"))
    with pytest.raises(ConfigurationError, match="must return the IR text"):
        module.transform(lambda ir: None)


def test_apply_and_optimize(vecops_records, tmp_path):
    module = load(vecops_records[SAXPY])

    def rename_helpers(m):
        for fn in m.functions:
            if fn.name.startswith("_ZN25__cuda_builtin_blockIdx"):
                fn.name = "block_index_x"

    renamed = module.apply(rename_helpers)
    assert renamed.function("block_index_x") is not None
    optimized = module.optimize("default<O2>")
    assert sum(optimized.opcode_histogram().values()) < sum(module.opcode_histogram().values())
    saved = optimized.save(tmp_path / "opt.bc")
    assert isinstance(load(saved), IRModule)
