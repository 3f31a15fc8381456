"""The standalone reproducer on a GPU: an exported folder built with CMake restores, launches, times and
verifies the recorded launch; a deliberately wrong expected epilogue makes it fail, naming the region and
the offset.

The first test builds the folder with CMake; the others run that program on other folders (``--dir``):
the program is the same for every export. Synthetic recordings (real kernels, host-computed epilogues)
cover in-place and atomic kernels, module globals, pointers in memory with a relocatable heap, forced
relocation, a recompiled configuration, a faulting and a hanging kernel; recordings made with
`mneme record` cover globals, a linked list and launch attributes (clusters, cooperative, a large
parameter buffer).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import mneme.testing.synthetic_recordings as synth
from mneme.testing.reproducer_build import cmake_build, fresh_compile_cache, run_program

#: A real recording (vecadd, recorded on an H100), committed.
COMMITTED = Path(__file__).resolve().parents[1] / "data" / "recordings" / "vecadd"
from test_record import mneme_record, only_database, programs, recorder_lib  # noqa: F401  (fixtures)

from mneme.model.experiment import ExperimentConfiguration
from mneme.recording.execution import RecordedExecution
from mneme.reproducer import export_reproducer
from mneme.reproducer.raw_format import read_launch, read_regions
from mneme.testing.synthetic import write_vecadd_recording

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    fresh_compile_cache(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def vecadd(tmp_path_factory) -> RecordedExecution:
    rec = write_vecadd_recording(tmp_path_factory.mktemp("vecadd"), n=1 << 20, block=256)
    return RecordedExecution.from_json(rec.path)


@pytest.fixture(scope="module")
def built(vecadd, tmp_path_factory) -> tuple[Path, Path]:
    """The vecadd recording exported and built with CMake: (folder, program)."""
    folder = tmp_path_factory.mktemp("built") / "repro"
    export_reproducer(vecadd, None, folder)
    return folder, cmake_build(folder)


def verified(done) -> None:
    what = f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == 0 and "\nVERIFIED\n" in done.stdout and "MISMATCH" not in done.stdout, what
    assert "time: mean " in done.stdout, what


def export_and_run(program: Path, recording: RecordedExecution, folder: Path, *args: str, record_id=None,
                   config=None):  # fmt: skip
    export_reproducer(recording, record_id, folder, config)
    return run_program(program, "--dir", folder, *args)


def test_the_built_reproducer_verifies_and_a_wrong_epilogue_fails(built, tmp_path):
    folder, program = built
    done = run_program(program)  # no --dir: the folder it was built from
    verified(done)
    assert "heap at its recorded addresses" in done.stdout and "code kernel.cubin (sm_" in done.stdout, done.stdout
    assert "RELOCATED" not in done.stdout, done.stdout

    wrong = tmp_path / "wrong"
    shutil.copytree(folder, wrong, ignore=shutil.ignore_patterns("build"))
    c = {r.name: r for r in read_regions(wrong)}["c"]
    epilogue = bytearray((wrong / "memory" / "epilogue.bin").read_bytes())
    epilogue[c.offset + 21] ^= 0x40
    (wrong / "memory" / "epilogue.bin").write_bytes(bytes(epilogue))
    done = run_program(program, "--dir", wrong)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "MISMATCH region c offset 21 (" in done.stdout and "1 differ after launch 1, 5" in done.stdout, done.stdout
    assert "VERIFIED" not in done.stdout


def test_the_committed_recording_verifies(built, tmp_path):
    done = export_and_run(built[1], RecordedExecution.from_json(str(COMMITTED)), tmp_path / "repro")
    verified(done)


def test_an_in_place_atomic_kernel_is_reset_before_every_launch(built, tmp_path):
    rec = RecordedExecution.from_json(str(synth.axpy_count(tmp_path / "rec")))
    verified(export_and_run(built[1], rec, tmp_path / "repro", "--iterations", "5", "--warmup", "2"))


def test_module_globals_are_restored_by_name(built, tmp_path):
    rec = RecordedExecution.from_json(str(synth.scale_by_global(tmp_path / "rec")))
    verified(export_and_run(built[1], rec, tmp_path / "repro"))


def test_pointers_in_memory_follow_a_relocatable_heap(built, tmp_path):
    rec = RecordedExecution.from_json(str(synth.gather_sum(tmp_path / "rec")))
    done = export_and_run(built[1], rec, tmp_path / "repro")
    verified(done)
    assert "RELOCATED" in done.stdout and "the recording is relocatable" in done.stdout


def test_forced_relocation_rewrites_the_pointer_arguments(built, vecadd, tmp_path):
    done = export_and_run(built[1], vecadd, tmp_path / "repro", "--relocate")
    verified(done)
    assert "RELOCATED" in done.stdout and "--relocate" in done.stdout


def test_a_recompiled_configuration_runs_its_own_code(built, vecadd, tmp_path):
    config = ExperimentConfiguration.from_dict({"grid": {"x": 8192}, "block": {"x": 128}, "codegen_opt": 1})
    done = export_and_run(built[1], vecadd, tmp_path / "repro", config=config)
    verified(done)
    assert read_launch(tmp_path / "repro").code_tier == "ptx" and "block 128x1x1" in done.stdout


def test_a_faulting_kernel_is_reported(built, tmp_path):
    rec = RecordedExecution.from_json(str(synth.vecadd_wild_pointer(tmp_path / "rec")))
    done = export_and_run(built[1], rec, tmp_path / "repro")
    assert done.returncode == 2 and "reproducer: error: " in done.stderr and "CUDA_ERROR_" in done.stderr, done.stderr


def test_a_kernel_that_never_ends_times_out(built, tmp_path):
    rec = RecordedExecution.from_json(str(synth.hang(tmp_path / "rec")))
    done = export_and_run(built[1], rec, tmp_path / "repro", "--timeout", "2")
    assert done.returncode == 2 and "did not finish within 2 s" in done.stderr, done.stderr


@pytest.mark.parametrize("program_name,args,kernel", [("globals", [], "scaled_copy"), ("linked_list", [], "walk")])
def test_recorded_programs_verify(built, recorder_lib, programs, tmp_path, program_name, args, kernel):  # noqa: F811
    mneme_record(recorder_lib, tmp_path / "rdb", [programs / program_name, *args])
    rec = only_database(tmp_path / "rdb", kernel)
    for record_id in rec.instances:
        verified(export_and_run(built[1], rec, tmp_path / record_id, record_id=record_id))


def test_recorded_launch_attributes_are_repeated(built, recorder_lib, programs, tmp_path):  # noqa: F811
    mneme_record(recorder_lib, tmp_path / "rdb", [programs / "launch_attrs"])
    for kernel, attribute in (("cluster_exchange", "cluster_dim"), ("coop_total", "cooperative"), ("big_param", None)):
        rec = only_database(tmp_path / "rdb", kernel)
        for record_id in rec.instances:
            folder = tmp_path / record_id
            verified(export_and_run(built[1], rec, folder, record_id=record_id))
            if attribute:
                assert attribute in [name for _, name, _ in read_launch(folder).attributes]
