"""What the wrapper reads from nvcc command lines (typed by hand, or written by CMake)."""

from __future__ import annotations

from mneme.toolchain.nvcc_args import parse


def test_one_step_build():
    inv = parse(["-arch=sm_80", "-O3", "-o", "app", "main.cu", "util.cpp", "-lcublas"])
    assert inv.cuda_sources == ["main.cu"] and inv.sources == ["main.cu", "util.cpp"]
    assert inv.output == "app" and not inv.compile_only and inv.produces_binary
    assert inv.ir_arch == "sm_80"
    assert inv.binary_output == "app"


def test_cmake_style_compile_step():
    argv = [
        "-forward-unknown-to-host-compiler", "-DDEMO=1", "-I/src/inc", "-isystem", "/opt/inc",
        "--generate-code=arch=compute_90,code=[compute_90,sm_90]", "-std=c++17", "-Xcompiler=-fPIC",
        "-MD", "-MT", "CMakeFiles/demo.dir/k.cu.o", "-MF", "CMakeFiles/demo.dir/k.cu.o.d",
        "-x", "cu", "-c", "/src/k.cu", "-o", "CMakeFiles/demo.dir/k.cu.o",
    ]
    inv = parse(argv)
    assert inv.compile_only and inv.cuda_sources == ["/src/k.cu"]
    assert inv.object_for("/src/k.cu") == "CMakeFiles/demo.dir/k.cu.o"
    assert inv.ir_arch == "sm_90"
    assert inv.clang_flags == ["-DDEMO=1", "-I/src/inc", "-isystem", "/opt/inc", "-std=c++17"]
    assert "CMakeFiles/demo.dir/k.cu.o.d" not in inv.sources


def test_x_cu_makes_cpp_sources_cuda_and_gencode_is_read():
    inv = parse(["-x", "cu", "-gencode", "arch=compute_75,code=sm_75", "-c", "a.cpp", "b.cpp"])
    assert inv.cuda_sources == ["a.cpp", "b.cpp"]
    assert inv.object_for("a.cpp") == "a.o" and inv.object_for("b.cpp") == "b.o"
    assert inv.ir_arch == "sm_75"


def test_outputs_without_an_elf_are_not_embedded_into():
    for flag in ("-ptx", "-E", "-M", "--version", "-cubin", "-lib"):
        assert not parse([flag, "k.cu"]).produces_binary, flag


def test_rdc_fast_math_and_defaults():
    inv = parse(["-dc", "--use_fast_math", "k.cu"])
    assert inv.relocatable_device_code and inv.compile_only
    assert "-ffast-math" in inv.clang_flags
    assert parse(["-rdc=true", "k.cu"]).relocatable_device_code
    assert parse(["k.cu"]).ir_arch == "sm_90" and parse(["k.cu"]).binary_output == "a.out"
