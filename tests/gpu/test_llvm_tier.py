"""The LLVM tier end to end on a GPU: instrumented build, `mneme record`, replay through
each pipeline, specialization, and a broken IR transformation that verification catches.

The program is tests/mneme/llvm/data/vecops.cu. Where clang and the LLVM tools are
installed it is built through the c++ wrapper; elsewhere (the GPU machine may
have no clang) nvcc builds it and the committed records of the same source
(tests/mneme/llvm/data/vecops.records, made by tests/mneme/llvm/data/regenerate.py) are
embedded with objcopy: the same section the wrapper would have written.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mneme.testing.gpu import child_env  # noqa: E402

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "mneme" / "llvm" / "data"
KERNELS = {"saxpy": "_Z5saxpyifPKfPf", "wave": "_Z4waveiPKfPf", "stencil": "_Z7stencilPKdPdii",
           "affine": "_Z6affine6AffinePf6float4", "rowsum": "_Z6rowsumiiPKfPf"}
PIPELINES = ["default<O0>", "default<O1>", "default<O2>", "default<O3>", "default<Os>", "default<Oz>",
             "sroa,instcombine,simplifycfg,newgvn"]


def _env() -> dict[str, str]:
    return child_env()


def _nvcc() -> str:
    found = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(found).exists():
        pytest.skip("nvcc not found")
    return found


def _build(out: Path) -> str:
    """Build vecops into ``out``; returns how ("wrapper" or "records")."""
    pytest.importorskip("llvmlite", reason="the LLVM tier needs llvmlite")
    from mneme.toolchain import device_ir
    from mneme.toolchain.embed import embed_records

    arch = ["-arch=native"]
    try:
        device_ir.find_tools()
        have_clang = True
    except device_ir.DeviceIRError:
        have_clang = False
    if have_clang:
        cmd = [str(REPO / "mneme/toolchain/bin/mneme-c++"), *arch, "-o", str(out), str(DATA / "vecops.cu")]
        env = {**_env(), "MNEME_IR_STRICT": "1", "MNEME_NVCC": _nvcc()}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        return "wrapper"
    proc = subprocess.run([_nvcc(), *arch, "-o", str(out), str(DATA / "vecops.cu")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    from mneme.llvm.section import decode_records

    embed_records(str(out), decode_records((DATA / "vecops.records").read_bytes()))
    return "records"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """kernel key -> (database path, record id) of vecops recorded with `mneme record`."""
    from mneme.llvm.embedded import find_kernel_bitcode

    work = tmp_path_factory.mktemp("llvm_tier")
    app = work / "vecops"
    _build(app)
    for name in KERNELS.values():  # nvcc's names; the static rowsum is _ZL6rowsumiiPKfPf in the IR
        assert find_kernel_bitcode(app, name) is not None, name
    rdb = work / "rdb"
    proc = subprocess.run(
        [sys.executable, "-m", "mneme", "record", "-rdb", str(rdb), "--", str(app)],
        capture_output=True, text=True, env=_env(), cwd=work, timeout=300,
    )
    assert proc.returncode == 0, f"mneme record failed:\n{proc.stdout}\n{proc.stderr}"
    assert "vecops done" in proc.stdout
    found = {}
    for path in rdb.glob("*.json"):
        db = json.loads(path.read_text())
        name = (db.get("kernel") or {}).get("name")
        for key, kernel in KERNELS.items():
            if name == kernel and db.get("instances"):
                found[key] = (str(path), sorted(db["instances"])[0])
    assert set(found) == set(KERNELS), f"recorded {sorted(found)} of {sorted(KERNELS)}"
    return found


def _replayer(recorded, key):
    from mneme.recording.execution import RecordedExecution
    from mneme.replay import Replayer

    database, record_id = recorded[key]
    recording = RecordedExecution.from_json(database)
    assert recording.code.bitcode is not None, "the recorder did not store the embedded bitcode"
    return recording, Replayer(recording, record_id)


def _baseline(replayer):
    return replayer.baseline()


@pytest.mark.parametrize("key", sorted(KERNELS))
def test_each_pipeline_replays_and_verifies(recorded, key):
    recording, replayer = _replayer(recorded, key)
    with replayer:
        base = _baseline(replayer)
        for passes in PIPELINES:
            config = base.replace(passes=passes)
            result = replayer.run(config, iterations=3, warmup=1)
            assert result.verified, f"{passes}: {result.status} {result.error} {result.mismatches}"
            if passes != "default<O3>":  # default<O3> is the baseline's pipeline (recorded code)
                assert replayer.compile(config).tier == "llvm", passes


def test_specialization_changes_the_ptx_and_still_verifies(recorded):
    recording, replayer = _replayer(recorded, "stencil")
    with replayer:
        base = _baseline(replayer).replace(passes="default<O2>")
        special = base.replace(specialize=True, specialize_dims=True)
        plain_ptx = replayer.compile(base).ptx
        special_ptx = replayer.compile(special).ptx
        assert plain_ptx.count("ld.param") > special_ptx.count("ld.param")  # nx, ny became immediates
        assert "%ntid.x" in plain_ptx and "%ntid.x" not in special_ptx  # blockDim folded
        for config in (base, special, special.replace(set_launch_bounds=True, max_threads=256, min_blocks_per_sm=2)):
            result = replayer.run(config, iterations=3, warmup=1)
            assert result.verified, f"{config}: {result.status} {result.error}"


def test_a_broken_transformation_fails_verification(recorded):
    from mneme.llvm import load

    recording, replayer = _replayer(recorded, "saxpy")
    with replayer:
        config = _baseline(replayer)
        module = load(recording.load_code("bitcode"), kernel=recording.kernel_name)

        def run(transformed) -> object:
            return _run_ptx(replayer, config, transformed.to_ptx(passes="default<O3>", arch=replayer.arch))

        same = run(module.transform(lambda ir: ir))  # the control: the path itself is faithful
        assert same.verified, f"{same.status}: {same.error}"
        broken = run(module.transform(lambda ir: ir.replace("fadd contract float", "fsub contract float")))
        assert not broken.verified and broken.status == "failed_verification"
        assert broken.mismatches


def _run_ptx(replayer, config, ptx):
    from mneme.replay.compile import CompiledCode, default_cache, ptxas_flags

    product = default_cache().compile(ptx, ptxas_flags(3, replayer.arch), replayer.arch)
    return replayer.run(config, iterations=2, warmup=1, compiled=CompiledCode(product.image, "llvm", product.key,
                                                                                replayer.arch, ptx))


@pytest.mark.parametrize("key", ["affine", "stencil"])
def test_every_parameter_specialized_through_compile_to_ptx_verifies(recorded, key):
    """compile_to_ptx's own contract (parameter index -> recorded bytes), byval structs and
    vectors included, with the launch dimensions folded too."""
    from mneme.llvm import compile_to_ptx

    recording, replayer = _replayer(recorded, key)
    with replayer:
        config = _baseline(replayer)
        args = replayer.instance.arguments
        # pointers only where buffers sit at their recorded addresses (a relocated replay moves them)
        values = {
            i: bytes(args[p.offset : p.offset + p.size])
            for i, p in enumerate(recording.kernel.params)
            if not (replayer.relocated and p.kind == "pointer")
        }
        assert values, "the recording has no parameter layout"
        ptx = compile_to_ptx(
            recording.load_code("bitcode"), kernel=recording.kernel_name, specialize=values,
            dims=(config.grid.as_tuple(), config.block.as_tuple()), arch=replayer.arch,
        )
        entry = ptx[ptx.index(".entry"):]
        if not replayer.relocated:
            assert "ld.param" not in entry  # every parameter is a constant now
        result = _run_ptx(replayer, config, ptx)
        assert result.verified, f"{result.status}: {result.error}"
