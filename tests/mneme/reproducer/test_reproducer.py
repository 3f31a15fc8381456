"""`mneme export-reproducer` without a GPU: the folder's files and formats, the CLI's errors, and that the
generated C++ program builds here (g++ and CMake) and checks its files (`--check`).

tests/gpu/test_reproducer_gpu.py builds and runs the program on a GPU.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
from pathlib import Path

import pytest

import mneme.testing.synthetic_recordings as synth
from mneme.cli import main
from mneme.errors import ConfigurationError
from mneme.model.experiment import ExperimentConfiguration
from mneme.recording.execution import RecordedExecution
from mneme.reproducer import ExportError, export_reproducer
from mneme.reproducer.raw_format import read_launch, read_pointers, read_regions
from mneme.testing.gpu import gpu_unavailable_reason
from mneme.testing.reproducer_build import (
    TEMPLATE,
    cmake_build,
    compile_with_gxx,
    fake_driver,
    fresh_compile_cache,
    run_program,
)
from mneme.testing.synthetic import write_vecadd_recording

#: A real recording (vecadd, recorded on an H100), committed.
COMMITTED = Path(__file__).resolve().parents[2] / "data" / "recordings" / "vecadd"



@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    fresh_compile_cache(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def vecadd(tmp_path_factory) -> RecordedExecution:
    rec = write_vecadd_recording(tmp_path_factory.mktemp("vecadd"), n=1000, block=256)  # 4000-byte regions
    return RecordedExecution.from_json(rec.path)


def regions_by_name(instance, phase: str) -> dict:
    snapshot = instance.load_prologue() if phase == "prologue" else instance.load_epilogue()
    return {r.name: r for r in snapshot.regions}


def test_the_folder_holds_the_code_the_memory_and_the_launch(vecadd, tmp_path):
    out = export_reproducer(vecadd, None, tmp_path / "repro")
    folder = out.directory
    names = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert names == {"README.md", "CMakeLists.txt", "reproducer.cpp", "config.json", "launch.txt", "regions.txt",
                     "pointers.txt", "kernel.cubin", "kernel.ptx", "memory/prologue.bin", "memory/epilogue.bin"}
    inst = vecadd.single_instance()
    assert (folder / "kernel.cubin").read_bytes() == vecadd.load_code("cubin")
    assert (folder / "kernel.ptx").read_bytes() == vecadd.load_code("ptx")

    launch = read_launch(folder)
    assert launch.kernel == "_Z6vecaddPKfS0_Pfi" and launch.record_id == inst.record_id
    assert launch.static_hash == vecadd.static_hash and launch.demangled.startswith("vecadd(")
    assert (launch.grid, launch.block, launch.shared_mem) == ((4, 1, 1), (256, 1, 1), 0)
    assert launch.args == inst.arguments and len(launch.args) == 28
    assert launch.params == ((0, 8, "pointer"), (8, 8, "pointer"), (16, 8, "pointer"), (24, 4, "scalar"))
    assert (launch.code_tier, launch.arch, launch.heap, launch.attributes) == ("recorded", "sm_90", "fixed", ())
    assert (launch.iterations, launch.warmup, launch.jit_max_registers) == (3, 2, None)

    regions = read_regions(folder)
    prologue, epilogue = regions_by_name(inst, "prologue"), regions_by_name(inst, "epilogue")
    assert [r.name for r in regions] == ["a", "b", "c"]
    pro_bin = (folder / "memory" / "prologue.bin").read_bytes()
    epi_bin = (folder / "memory" / "epilogue.bin").read_bytes()
    assert len(pro_bin) == len(epi_bin) == sum(r.size for r in regions) == out.memory_bytes == 12000
    offset = 0
    for r in regions:
        assert (r.kind, r.base, r.size, r.offset, r.policy) == ("heap", prologue[r.name].base, 4000, offset, "bitwise")
        assert pro_bin[r.offset : r.offset + r.size] == prologue[r.name].read(vecadd.store)
        assert epi_bin[r.offset : r.offset + r.size] == epilogue[r.name].read(vecadd.store)
        offset += r.size
    assert [r.written for r in regions] == [False, False, True]  # only c changes: only c is reset

    # The three pointer arguments point at a, b and c; nothing in memory looks like a pointer.
    sites = read_pointers(folder)
    assert [(s.where, s.region, s.offset, s.target) for s in sites] == [
        ("args", None, 0, 0), ("args", None, 8, 1), ("args", None, 16, 2)]
    assert json.loads((folder / "config.json").read_text())["Replay-config"]["block"] == {"x": 256, "y": 1, "z": 1}
    readme = (folder / "README.md").read_text()
    assert "`_Z6vecaddPKfS0_Pfi`" in readme and inst.record_id in readme and "$" not in readme


def test_the_committed_recording_exports_at_its_recorded_addresses(tmp_path):
    rec = RecordedExecution.from_json(str(COMMITTED))
    inst = rec.single_instance()
    export_reproducer(rec, inst.record_id, tmp_path / "repro")
    regions = read_regions(tmp_path / "repro")
    pointers = struct.unpack_from("<QQQ", inst.arguments)
    assert [r.base for r in regions] == list(pointers) and regions[0].base == 0x7F0000000000
    assert (tmp_path / "repro" / "memory" / "prologue.bin").stat().st_size == sum(r.size for r in regions)
    assert read_launch(tmp_path / "repro").grid == inst.grid_dim.as_tuple()


def test_pointers_in_memory_and_a_relocatable_heap(tmp_path):
    rec = RecordedExecution.from_json(str(synth.gather_sum(tmp_path / "rec", n_nodes=8)))
    export_reproducer(rec, None, tmp_path / "repro")
    assert read_launch(tmp_path / "repro").heap == "relocatable"
    names = [r.name for r in read_regions(tmp_path / "repro")]
    data, nodes = names.index("data"), names.index("nodes")
    sites = read_pointers(tmp_path / "repro")
    # Each 16-byte node starts with a pointer into the data buffer, in the prologue and the epilogue.
    for where in ("prologue", "epilogue"):
        assert [(s.region, s.offset, s.target) for s in sites if s.where == where] == [
            (nodes, 16 * i, data) for i in range(8)]
    assert [(s.offset, s.target) for s in sites if s.where == "args"] == [(0, nodes), (16, names.index("out"))]


def test_module_globals_are_exported_by_name(tmp_path):
    rec = RecordedExecution.from_json(str(synth.scale_by_global(tmp_path / "rec", n=100)))
    export_reproducer(rec, None, tmp_path / "repro")
    regions = {r.name: r for r in read_regions(tmp_path / "repro")}
    assert (regions["g_scale"].kind, regions["g_scale"].written) == ("global", False)
    assert (regions["g_hits"].kind, regions["g_hits"].written) == ("global", True)


def test_a_tolerance_policy_is_listed_and_the_readme_says_bytes_are_compared(tmp_path):
    from mneme.format.policy import VerifyPolicy

    path = synth.axpy_count(tmp_path / "rec", n=64, tolerance=VerifyPolicy("f32", "ulp", 4))
    rec = RecordedExecution.from_json(str(path))
    export_reproducer(rec, None, tmp_path / "repro")
    assert {r.name: r.policy for r in read_regions(tmp_path / "repro")}["x"] == "f32:ulp:4"
    assert "compares every region byte for byte" in (tmp_path / "repro" / "README.md").read_text()


def test_a_recompiling_configuration_exports_its_own_code(vecadd, tmp_path):
    from mneme.errors import NotAvailableError
    from mneme.replay.compile import CompileOptions, find_ptxas

    try:
        find_ptxas()
    except NotAvailableError as exc:
        pytest.skip(str(exc))
    config = ExperimentConfiguration.from_dict({"grid": {"x": 8}, "block": {"x": 128}, "codegen_opt": 1})
    out = export_reproducer(vecadd, None, tmp_path / "repro", config, compile_options=CompileOptions(max_registers=32))
    launch = read_launch(tmp_path / "repro")
    assert (out.code_tier, launch.code_tier, launch.grid, launch.block) == ("ptx", "ptx", (8, 1, 1), (128, 1, 1))
    assert launch.jit_max_registers == 32
    cubin = (tmp_path / "repro" / "kernel.cubin").read_bytes()
    assert cubin[:4] == b"\x7fELF" and cubin != vecadd.load_code("cubin")
    assert b".entry _Z6vecaddPKfS0_Pfi" in (tmp_path / "repro" / "kernel.ptx").read_bytes()
    assert json.loads((tmp_path / "repro" / "config.json").read_text())["Replay-config"]["codegen_opt"] == 1


def test_nothing_is_written_when_the_configuration_cannot_be_compiled(vecadd, tmp_path):
    config = ExperimentConfiguration(grid=vecadd.single_instance().grid_dim, block=vecadd.single_instance().block_dim,
                                     passes="default<O1>")  # the LLVM tier: this recording has no bitcode
    with pytest.raises(Exception, match="bitcode"):
        export_reproducer(vecadd, None, tmp_path / "repro", config)
    assert not (tmp_path / "repro").exists()
    with pytest.raises(ConfigurationError):
        export_reproducer(vecadd, None, tmp_path / "repro", iterations=0)


def test_an_existing_folder_needs_force_and_force_replaces_only_the_export(vecadd, tmp_path):
    folder = tmp_path / "repro"
    export_reproducer(vecadd, None, folder)
    (folder / "build").mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match=f"cannot write {re.escape(str(folder))}: it exists and is not empty"):
        export_reproducer(vecadd, None, folder)
    export_reproducer(vecadd, None, folder, force=True)
    assert (folder / "notes.txt").read_text() == "mine" and (folder / "build").is_dir()
    assert read_launch(folder).kernel == vecadd.kernel_name


# -- the command line ----------------------------------------------------------------------------------


def test_cli_writes_the_folder(vecadd, tmp_path, capsys):
    assert main(["export-reproducer", "-rdb", vecadd.path, "-o", str(tmp_path / "repro"), "-bidx", "128",
                 "-gidx", "8", "-it", "10", "--warmup", "1"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'repro'}" in out and "cmake -S" in out
    launch = read_launch(tmp_path / "repro")
    assert (launch.grid, launch.block, launch.iterations, launch.warmup) == ((8, 1, 1), (128, 1, 1), 10, 1)
    assert launch.code_tier == "recorded"  # a launch shape alone runs the recorded cubin


def test_cli_takes_a_configuration_file(vecadd, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"Replay-config": {"block": {"x": 64}, "grid": {"x": 16}}}))
    assert main(["export-reproducer", "-rdb", vecadd.path, "-c", str(config), "-o", str(tmp_path / "repro")]) == 0
    assert read_launch(tmp_path / "repro").block == (64, 1, 1)


@pytest.mark.parametrize("case", ["unknown id", "not empty", "not writable"])
def test_cli_errors_are_one_line_and_exit_2(vecadd, tmp_path, capsys, case):
    folder = tmp_path / "repro"
    argv = ["export-reproducer", "-rdb", vecadd.path, "-o", str(folder)]
    if case == "unknown id":
        argv += ["-rid", "123"]
        expected = "mneme export-reproducer: error: no instance 123 in "
    elif case == "not empty":
        folder.mkdir()
        (folder / "x").write_text("x")
        expected = f"mneme export-reproducer: error: cannot write {folder}: it exists and is not empty"
    else:
        (tmp_path / "file").write_text("")
        folder = tmp_path / "file" / "repro"
        argv[-1] = str(folder)
        expected = f"mneme export-reproducer: error: cannot write {folder}: Not a directory"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(expected) and err.count("\n") == 1, err


# -- the generated program, built here -----------------------------------------------------------------


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    """The generated program compiled with g++ (as the folder's README says, without CMake)."""
    return compile_with_gxx(tmp_path_factory.mktemp("gxx") / "reproducer")


def test_the_program_checks_a_folder_without_a_gpu(program, tmp_path):
    rec = RecordedExecution.from_json(str(synth.gather_sum(tmp_path / "rec", n_nodes=8)))
    export_reproducer(rec, None, tmp_path / "repro")
    done = run_program(program, "--check", "--dir", str(tmp_path / "repro"))
    assert done.returncode == 0, done.stderr
    assert "3 region(s)" in done.stdout and "18 pointer site(s)" in done.stdout
    assert "the files are complete and consistent" in done.stdout


def test_the_program_refuses_damaged_files(program, vecadd, tmp_path):
    folder = tmp_path / "repro"
    export_reproducer(vecadd, None, folder)
    epilogue = folder / "memory" / "epilogue.bin"
    epilogue.write_bytes(epilogue.read_bytes()[:-1])
    done = run_program(program, "--check", "--dir", str(folder))
    assert done.returncode == 2 and "epilogue.bin holds 11999 bytes; regions.txt describes 12000" in done.stderr
    export_reproducer(vecadd, None, folder, force=True)
    (folder / "launch.txt").write_text((folder / "launch.txt").read_text() + "colour blue\n")
    done = run_program(program, "--check", "--dir", str(folder))
    assert done.returncode == 2 and "unknown key 'colour'" in done.stderr


def test_without_a_driver_the_program_says_so(program, vecadd, tmp_path):
    reason = gpu_unavailable_reason()
    if reason is None:
        pytest.skip("a GPU is usable here: tests/gpu/test_reproducer_gpu.py runs the program")
    export_reproducer(vecadd, None, tmp_path / "repro")
    done = run_program(program, "--dir", str(tmp_path / "repro"))
    assert done.returncode == 2 and "reproducer: error: " in done.stderr
    if "libcuda.so.1 not found" in reason:
        assert "no NVIDIA driver on this machine" in done.stderr


# -- the program's own logic, run against a stand-in driver (fake_libcuda.cpp: host memory, host kernels) ----


@pytest.fixture(scope="module")
def fake_env(tmp_path_factory) -> dict[str, str]:
    return fake_driver(tmp_path_factory.mktemp("fake-driver"))


def run_with_fake(program, fake_env, recording_path, folder, *args, **env):
    export_reproducer(RecordedExecution.from_json(str(recording_path)), None, folder)
    return run_program(program, "--dir", folder, *args, env={**fake_env, **env})


def assert_verified(done) -> None:
    what = done.stdout + done.stderr
    assert done.returncode == 0 and "\nVERIFIED\n" in done.stdout and "time: mean" in done.stdout, what


def test_stand_in_driver_verifies_and_a_wrong_epilogue_is_named(program, fake_env, vecadd, tmp_path):
    folder = tmp_path / "repro"
    done = run_with_fake(program, fake_env, vecadd.path, folder)
    assert_verified(done)
    assert "heap at its recorded addresses (1 reservation(s))" in done.stdout
    c = {r.name: r for r in read_regions(folder)}["c"]
    epilogue = bytearray((folder / "memory" / "epilogue.bin").read_bytes())
    epilogue[c.offset + 21] ^= 0x40
    (folder / "memory" / "epilogue.bin").write_bytes(bytes(epilogue))
    done = run_program(program, "--dir", folder, env=fake_env)
    assert done.returncode == 1 and "VERIFIED" not in done.stdout, done.stdout
    assert "MISMATCH region c offset 21 (region 2, heap 0x200000002000, 4000 bytes: 1 differ after launch 1, 5;" \
        in done.stdout, done.stdout


@pytest.mark.parametrize("build,args,relocated", [
    (lambda d: synth.axpy_count(d, n=5000), ("--iterations", "5"), False),  # in place: reset before every launch
    (lambda d: synth.scale_by_global(d, n=500), (), False),  # globals found by name in the module
    (lambda d: synth.gather_sum(d, n_nodes=16), (), True),  # pointers in memory, a relocatable heap
])  # fmt: skip
def test_stand_in_driver_runs_the_synthetic_kernels(program, fake_env, tmp_path, build, args, relocated):
    done = run_with_fake(program, fake_env, build(tmp_path / "rec"), tmp_path / "repro", *args)
    assert_verified(done)
    assert ("RELOCATED" in done.stdout) == relocated


def test_stand_in_driver_relocates_or_refuses_when_the_addresses_are_taken(program, fake_env, vecadd, tmp_path):
    folder = tmp_path / "repro"
    done = run_with_fake(program, fake_env, vecadd.path, folder, "--relocate")
    assert_verified(done)
    assert "RELOCATED: the heap is not at its recorded addresses (relocation was asked for (--relocate))" in done.stdout
    done = run_program(program, "--dir", folder, env={**fake_env, "FAKE_CUDA_TAKEN": "1"})
    assert_verified(done)
    assert "the range 0x200000000000-0x200000200000 is taken in this process" in done.stdout
    done = run_program(program, "--dir", folder, "--no-relocate", env={**fake_env, "FAKE_CUDA_TAKEN": "1"})
    assert done.returncode == 3 and "relocating it was refused (--no-relocate)" in done.stderr, done.stderr


def test_stand_in_driver_faults_and_hangs_exit_2(program, fake_env, tmp_path):
    done = run_with_fake(program, fake_env, synth.vecadd_wild_pointer(tmp_path / "wild"), tmp_path / "w")
    assert done.returncode == 2 and "failed: CUDA_ERROR_ILLEGAL_ADDRESS" in done.stderr, done.stderr
    done = run_with_fake(program, fake_env, synth.hang(tmp_path / "hang"), tmp_path / "h", "--timeout", "0.5")
    assert done.returncode == 2 and "did not finish within 0.5 s (--timeout)" in done.stderr, done.stderr


def test_the_folder_builds_with_cmake(vecadd, tmp_path):
    folder = tmp_path / "repro"
    export_reproducer(vecadd, None, folder)
    done = run_program(cmake_build(folder), "--check")  # finds its folder without --dir
    assert done.returncode == 0 and "3 region(s)" in done.stdout, done.stderr


def test_the_queue_ahead_kernel_is_valid_ptx(tmp_path):
    from mneme.errors import NotAvailableError
    from mneme.replay.compile import find_ptxas

    try:
        ptxas = find_ptxas()
    except NotAvailableError as exc:
        pytest.skip(str(exc))
    ptx = re.search(r'R"PTX\((.*?)\)PTX"', TEMPLATE.read_text(), re.S).group(1)
    (tmp_path / "spin.ptx").write_text(ptx)
    done = subprocess.run([ptxas, "-arch=sm_90", str(tmp_path / "spin.ptx"), "-o", str(tmp_path / "spin.cubin")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
