"""The native recorder under threads, on the CPU: `mneme record` runs an application against a fake CUDA driver
and CUPTI (tests/record/fake_cuda/: host memory for device memory, a thread per stream, the CUPTI launch and
module-loaded callbacks issued as the driver issues them, the module-loaded one with a module-loading lock held).

* Several threads launching at once, while another thread loads modules and others write managed memory, are
  recorded and the run finishes (the recorder used to deadlock here: a thread recording held the recorder's
  lock while loading its digest kernel, which waits for the module-loading lock; a thread inside a module load
  held that lock and waited for the recorder's lock in the module-loaded callback).
* Every instance is consistent: its own output is in its epilogue, and no other thread's kernel changed memory
  between its snapshots (the recorder used to let them run; with digests it could also commit an entry that
  named a piece of an entry committed after it: "no earlier piece has its digest").
* A forced deadline abandons the instance, which is written unsupported, and the application's output and exit
  status stay its own.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_native_recorder import recorder  # noqa: F401  (fixture)

from mneme.recording.execution import RecordedExecution
from mneme.testing import vecadd_code

FAKE = Path(__file__).resolve().parent / "fake_cuda"
CUDA_INCLUDE = Path("/usr/local/cuda/include")
N = 4096
WINDOW = (0x200000000000, 0x400000000000)  # the recorder's window and its fallbacks


@pytest.fixture(scope="module")
def recorder_lib(request) -> str:
    """MNEME_RECORDER_LIB, else the recorder built from this checkout (test_native_recorder.py's fixture)."""
    if os.environ.get("MNEME_RECORDER_LIB"):
        return os.environ["MNEME_RECORDER_LIB"]
    return str(request.getfixturevalue("recorder"))


@pytest.fixture(scope="module")
def fake(tmp_path_factory) -> Path:
    cxx = shutil.which("g++")
    if not cxx or not (CUDA_INCLUDE / "cupti.h").exists():
        pytest.skip("needs g++ and the CUDA toolkit headers (cuda.h, cupti.h)")
    out = tmp_path_factory.mktemp("fake_cuda")
    common = [cxx, "-std=c++17", "-O1", "-pthread", f"-I{CUDA_INCLUDE}"]
    subprocess.run([*common, "-shared", "-fPIC", "-fvisibility=hidden", "-Wl,-soname,libcuda.so.1", "-o",
                    out / "libcuda.so.1", FAKE / "fake_cuda.cpp"], check=True)
    subprocess.run([*common, "-shared", "-fPIC", "-fvisibility=hidden", "-DFAKE_CUPTI", "-o", out / "libcupti.so",
                    FAKE / "fake_cuda.cpp", f"-L{out}", "-l:libcuda.so.1", f"-Wl,-rpath,{out}"], check=True)
    for app in ("threads_app", "textures_app"):
        subprocess.run([*common, "-o", out / app, FAKE / f"{app}.cpp", f"-L{out}", "-l:libcuda.so.1"], check=True)
    (out / "vecadd.cubin").write_bytes(vecadd_code.CUBIN)
    return out


def app_env(fake: Path, recorder_lib: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                                          "FLUX_TASK_RANK", "PMIX_RANK", "MNEME_RECORD_STATS")}
    env.update(LD_LIBRARY_PATH=str(fake), MNEME_CUPTI_PATH=str(fake / "libcupti.so"), MNEME_RECORDER_LIB=recorder_lib,
               FAKE_CUBIN=str(fake / "vecadd.cubin"), **extra)
    return env


def run(command: list, env: dict, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    proc = subprocess.Popen([str(c) for c in command], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        pytest.fail(f"{command} did not finish within {timeout} s (hung):\n{err[-3000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err), time.monotonic() - started


def record(fake: Path, recorder_lib: str, rdb: Path, args: list, *options: str, **env: str):
    command = [sys.executable, "-m", "mneme", "record", "-rdb", rdb, "-mr", "0", *options, "--",
               fake / "threads_app", *args]
    return run(command, app_env(fake, recorder_lib, **env))


def check_instances(rdb: Path) -> tuple[int, int]:
    """(instances, abandoned); asserts every captured instance is consistent."""
    a = [i * 0.5 for i in range(N)]
    b = [2.0 - i * 0.25 for i in range(N)]
    output = struct.pack(f"<{N}f", *[x + y for x, y in zip(a, b)])
    count = abandoned = 0
    for db in rdb.glob("*.json"):
        rec = RecordedExecution.from_json(db)
        for inst in rec.instances.values():
            count += 1
            if not inst.supported:
                abandoned += 1
                assert any(r.startswith("the recorder abandoned this launch") for r in inst.unsupported), inst.unsupported
                continue
            own_output = struct.unpack("<QQQ", inst.arguments[:24])[2]
            pro = {r.base: r.read(rec.store) for r in inst.load_prologue().regions}
            epi = {r.base: r.read(rec.store) for r in inst.load_epilogue().regions}
            assert epi[own_output] == output, inst.record_id
            for base, before in pro.items():  # the window's buffers (managed ones are written by host threads)
                if base != own_output and WINDOW[0] <= base < WINDOW[1]:
                    assert epi[base] == before, f"{inst.record_id}: {base:#x} changed between the snapshots"
    return count, abandoned


@pytest.mark.parametrize("kernel_us,loads", [(1000, 0), (100, 100), (1000, 100), (5000, 100)])
def test_threads_launching_while_modules_load_are_recorded_consistently(fake, recorder_lib, tmp_path, kernel_us, loads):
    args = [8, 4, loads, 2]
    plain, _ = run([fake / "threads_app", *args], app_env(fake, recorder_lib, FAKE_KERNEL_US=str(kernel_us)))
    assert plain.returncode == 0 and plain.stdout == "threads_app: ok (8 threads, 4 rounds)\n", plain.stderr
    rec, _ = record(fake, recorder_lib, tmp_path / "rdb", args, FAKE_KERNEL_US=str(kernel_us))
    assert rec.returncode == 0 and rec.stdout == plain.stdout, rec.stderr[-3000:]
    assert "error" not in rec.stderr, rec.stderr[-3000:]
    assert check_instances(tmp_path / "rdb") == (8, 0), rec.stderr[-3000:]


@pytest.mark.parametrize("phase", ["prologue", "epilogue"])
def test_a_forced_deadline_abandons_the_instance_and_the_application_goes_on(fake, recorder_lib, tmp_path, phase):
    # The stall is long and the deadline short, but not so short that a loaded machine's snapshot passes it.
    rec, seconds = record(fake, recorder_lib, tmp_path / "rdb", [4, 3], "--deadline", "1",
                          MNEME_DEBUG_STALL_SNAPSHOT_MS="3000", MNEME_DEBUG_STALL_PHASE=phase)
    assert rec.returncode == 0 and rec.stdout == "threads_app: ok (4 threads, 3 rounds)\n", rec.stderr[-3000:]
    assert "mneme record: error" not in rec.stderr, rec.stderr[-3000:]
    assert f"the {phase} snapshot" in rec.stderr and "abandoned at a deadline and written unsupported" in rec.stderr
    count, abandoned = check_instances(tmp_path / "rdb")
    assert abandoned >= 1 and count >= abandoned
    assert seconds < 60


def test_a_kernel_longer_than_the_deadline_is_abandoned(fake, recorder_lib, tmp_path):
    rec, _ = record(fake, recorder_lib, tmp_path / "rdb", [1, 1], "--deadline", "1", FAKE_KERNEL_US="3000000")
    assert rec.returncode == 0 and rec.stdout == "threads_app: ok (1 threads, 1 rounds)\n", rec.stderr[-3000:]
    assert "the launch did not finish within 1.0 s" in rec.stderr, rec.stderr[-3000:]
    assert check_instances(tmp_path / "rdb") == (1, 1)
