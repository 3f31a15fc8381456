"""The instrumented build: wrappers, add_mneme(), `mneme config` (nvcc and clang, no GPU)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from llvm_test_support import DATA, REPO, WRAPPER_CXX, build_tools_missing, wrapper_env

from mneme.cli import main as cli_main
from mneme.llvm.embedded import embedded_kernels, find_kernel_bitcode, read_records

KERNELS = ["_Z5saxpyifPKfPf", "_Z4waveiPKfPf", "_Z7stencilPKdPdii", "_Z6affine6AffinePf6float4",
           "_ZL6rowsumiiPKfPf"]


_MISSING = build_tools_missing()
needs_clang = pytest.mark.skipif(_MISSING is not None, reason=f"instrumented build unavailable: {_MISSING}")
needs_nvcc = pytest.mark.skipif(
    not (shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists()), reason="nvcc not found"
)


def _run(cmd, cwd, env=None):
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, env=env or wrapper_env())


def test_one_step_build_embeds_every_kernel(vecops_app):
    assert embedded_kernels(vecops_app) == KERNELS
    assert find_kernel_bitcode(vecops_app, "_Z6rowsumiiPKfPf") is not None  # nvcc's name of the static kernel
    for record in read_records(vecops_app):
        assert record.bitcode[:4] == b"BC\xc0\xde"  # LLVM bitcode magic
        assert record.arch == "sm_90" and "clang" in record.producer
        assert record.source.endswith("vecops.cu")
    # the program nvcc built is untouched apart from the extra section: it still starts
    # (and, without a GPU, reports that the CUDA call failed instead of crashing).
    proc = subprocess.run([str(vecops_app)], capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr


def test_per_kernel_modules_hold_only_their_kernel(vecops_app, llvmlite_available):
    from mneme.llvm import load

    wave = load(vecops_app, kernel="_Z4waveiPKfPf")
    assert wave.kernels == ["_Z4waveiPKfPf"]
    names = {g.name for g in wave.global_variables()}
    assert {"launches", "weights"} <= names  # device variables keep their names
    assert any(fn.name == "__nv_sinf" for fn in wave.defined_functions())  # libdevice linked in by clang


@needs_clang
def test_separate_compile_and_link(tmp_path):
    kernel = tmp_path / "k.cu"
    kernel.write_text("__global__ void twice(float* v) { v[threadIdx.x] *= 2.0f; }\n"
                      "void run(float* v) { twice<<<1, 32>>>(v); }\n")
    main = tmp_path / "main.cu"
    main.write_text("void run(float*);\n__global__ void zero(float* v) { v[threadIdx.x] = 0; }\n"
                    "int main() { run(nullptr); zero<<<1, 1>>>(nullptr); return 0; }\n")
    assert _run([WRAPPER_CXX, "-arch=sm_90", "-c", kernel, "-o", "k.o"], tmp_path).returncode == 0
    assert _run([WRAPPER_CXX, "-arch=sm_90", "-c", main], tmp_path).returncode == 0
    assert embedded_kernels(tmp_path / "k.o") == ["_Z5twicePf"]
    assert _run([WRAPPER_CXX, "-arch=sm_90", "k.o", "main.o", "-o", "app"], tmp_path).returncode == 0
    assert sorted(embedded_kernels(tmp_path / "app")) == ["_Z4zeroPf", "_Z5twicePf"]


@needs_nvcc
def test_device_code_clang_rejects_warns_and_the_build_goes_on(tmp_path):
    src = tmp_path / "odd.cu"
    src.write_text("__global__ void k(int* p) { *p = 1; }\nint main() { return 0; }\n")
    env = wrapper_env()
    env.pop("MNEME_IR_STRICT")
    env["MNEME_CLANG"] = "/bin/false"  # stands for code clang's CUDA front end rejects and nvcc accepts
    proc = _run([WRAPPER_CXX, "-arch=sm_90", "-o", "app", src], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert "mneme: warning" in proc.stderr and "PTX" in proc.stderr
    assert find_kernel_bitcode(tmp_path / "app", "_Z1kPi") is None
    env["MNEME_IR_STRICT"] = "1"
    assert _run([WRAPPER_CXX, "-arch=sm_90", "-o", "app2", src], tmp_path, env).returncode == 1


@needs_nvcc
def test_nvcc_errors_pass_through(tmp_path):
    src = tmp_path / "broken.cu"
    src.write_text("__global__ void k( { }\n")
    proc = _run([WRAPPER_CXX, "-arch=sm_90", "-c", src], tmp_path)
    assert proc.returncode != 0 and "error" in proc.stderr


def test_mneme_config_prints_usable_paths(capsys):
    values = {}
    for what in ("cc", "cxx", "prefix", "libdir", "includedir", "cmakedir", "cflags", "ldflags"):
        assert cli_main(["config", what]) == 0
        values[what] = capsys.readouterr().out.strip()
    assert os.access(values["cxx"], os.X_OK) and os.access(values["cc"], os.X_OK)
    assert Path(values["cmakedir"], "mneme-config.cmake").exists()
    assert Path(values["includedir"], "mneme_section.h").exists()
    assert values["cflags"] == f"-I{values['includedir']}"
    assert Path(values["prefix"], "__init__.py").exists()


@pytest.mark.skipif(not shutil.which("cc"), reason="no host C compiler")
def test_cc_wrapper_runs_the_host_compiler(tmp_path):
    src = tmp_path / "m.c"
    src.write_text("int main(void) { return 3; }\n")
    cc = REPO / "mneme" / "toolchain" / "bin" / "mneme-cc"
    assert _run([cc, "-o", "m", src], tmp_path).returncode == 0
    assert subprocess.run([str(tmp_path / "m")]).returncode == 3


@needs_clang
@pytest.mark.skipif(not shutil.which("cmake"), reason="cmake not installed")
def test_cmake_add_mneme(tmp_path):
    src = tmp_path / "src"
    (src / "inc").mkdir(parents=True)
    (src / "inc" / "scale.h").write_text("#define SCALE 3.0f\n")
    (src / "app.cu").write_text(
        '#include "scale.h"\n__global__ void scale(float* v) { v[threadIdx.x] *= SCALE * FACTOR; }\n'
        "int main() { scale<<<1, 32>>>(nullptr); return 0; }\n"
    )
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(demo LANGUAGES CXX CUDA)\n"
        "find_package(mneme REQUIRED)\nadd_executable(demo app.cu)\n"
        "target_include_directories(demo PRIVATE inc)\ntarget_compile_definitions(demo PRIVATE FACTOR=2)\n"
        "set_target_properties(demo PROPERTIES CUDA_ARCHITECTURES 90)\nadd_mneme(demo STRICT)\n"
    )
    cmakedir = REPO / "mneme" / "cmake"
    env = wrapper_env()
    configure = _run(["cmake", "-S", src, "-B", tmp_path / "build", f"-DCMAKE_PREFIX_PATH={cmakedir}",
                      "-DCMAKE_CUDA_COMPILER=" + (shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")], tmp_path, env)
    assert configure.returncode == 0, configure.stdout + configure.stderr
    build = _run(["cmake", "--build", tmp_path / "build"], tmp_path, env)
    assert build.returncode == 0, build.stdout + build.stderr
    assert embedded_kernels(tmp_path / "build" / "demo") == ["_Z5scalePf"]


@needs_nvcc
def test_committed_records_embed_into_a_plain_nvcc_build(tmp_path):
    """What the GPU tests do on machines without clang: nvcc build + the committed records."""
    from mneme.llvm.section import decode_records
    from mneme.toolchain.embed import embed_records

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    app = tmp_path / "vecops"
    subprocess.run([nvcc, "-arch=sm_90", "-o", str(app), str(DATA / "vecops.cu")], check=True)
    embed_records(str(app), decode_records((DATA / "vecops.records").read_bytes()))
    assert embedded_kernels(app) == KERNELS
    assert all(len(r.kernels) == 1 for r in read_records(app))  # one module per kernel
