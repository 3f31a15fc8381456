"""Threads and deadlines (docs/recording.md, "Threads and deadlines"): `mneme record` never blocks the
application indefinitely, and launches from many threads are recorded correctly.

* Threaded programs over managed memory (tests/gpu/programs/threads/: host threads launching on their own
  streams, with and without cuBLAS, OpenMP, host threads writing other managed buffers the whole time) finish
  under `mneme record` with their own output and exit status.
* 8 threads on 8 streams, launching at once: every thread's instance is recorded and replays verified (the
  snapshots around a recorded launch see no other thread's kernel).
* A forced deadline (a debug stall of the snapshot, or a kernel running longer than the deadline) abandons
  the instance: written `supported: false` with the reason, refused by replay, and the application's output
  and exit status are those of a plain run.

cuBLAS variants need cublas_v2.h and libcublas (the CUDA toolkit's, or the nvidia-cublas Python package); they
are skipped with the reason where it is missing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_record import PROGRAMS, _nvcc, recorder_lib  # noqa: F401  (fixture)

from mneme.recording.execution import RecordedExecution
from mneme.testing.gpu import child_env

pytestmark = pytest.mark.gpu

THREADS = PROGRAMS / "threads"
RECORD_TIMEOUT_S = 180


def cublas_flags() -> tuple[list[str], str]:
    """nvcc flags that build and link against cuBLAS, or ([], why not)."""
    homes = [Path(_nvcc()).resolve().parents[1], Path("/usr/local/cuda")]
    homes += [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    places = [(cuda / "include", cuda / "lib64") for cuda in homes]
    places += [(cuda / "targets" / "x86_64-linux" / "include", cuda / "lib64") for cuda in homes]
    try:
        import nvidia.cublas as package  # the nvidia-cublas wheel (as PyTorch installs it)

        root = Path(next(iter(package.__path__)))
        places.append((root / "include", root / "lib"))
    except ImportError:
        pass
    for include, lib in places:
        if not (include / "cublas_v2.h").exists():
            continue
        libs = sorted(lib.glob("libcublas.so*"))
        if not libs:
            continue
        name = "cublas" if (lib / "libcublas.so").exists() else f":{libs[-1].name}"
        return [f"-I{include}", f"-L{lib}", f"-l{name}", "-Xlinker", f"-rpath={lib}"], ""
    return [], "cuBLAS is not installed here (no cublas_v2.h with libcublas in the CUDA toolkit or the nvidia-cublas package)"


@pytest.fixture(scope="module")
def threads(tmp_path_factory) -> dict:
    """The thread programs, built; a cuBLAS variant missing is the reason it is missing (a str)."""
    out = tmp_path_factory.mktemp("threads")
    nvcc = _nvcc()
    flags, why = cublas_flags()
    built: dict = {}
    builds = {
        "threads_managed": ("threads_managed.cu", []),
        "threads_omp": ("threads_omp.cu", ["-Xcompiler", "-fopenmp"]),
        "threads_streams": ("threads_streams.cu", []),
        "slow_kernels": ("slow_kernels.cu", []),
    }
    for name, (source, extra) in builds.items():
        subprocess.run([nvcc, "-O2", "-arch=sm_90", *extra, "-o", out / name, THREADS / source], check=True)
        built[name] = out / name
        if name in ("threads_managed", "threads_omp"):
            if why:
                built[name + "_cublas"] = why
            else:
                subprocess.run([nvcc, "-O2", "-arch=sm_90", *extra, "-DWITH_CUBLAS", "-o", out / (name + "_cublas"),
                                THREADS / source, *flags], check=True)
                built[name + "_cublas"] = out / (name + "_cublas")
    return built


def program(threads: dict, name: str) -> Path:
    found = threads[name]
    if isinstance(found, str):
        pytest.skip(found)
    return found


def run_plain(command: list) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=RECORD_TIMEOUT_S)


def record(recorder_lib: str, rdb: Path, command: list, *options: str, env: dict | None = None):  # noqa: F811
    """`mneme record` with a time limit: (process, seconds). A run past the limit is a hang: the test fails
    (and the application, in the agent's process group, is killed with it)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mneme", "record", "-rdb", str(rdb), *options, "--", *map(str, command)],
        env=child_env(MNEME_RECORDER_LIB=recorder_lib, **(env or {})), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=RECORD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"`mneme record` of {command} did not finish within {RECORD_TIMEOUT_S} s (hung); stderr:\n"
                    f"{err[-4000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), time.monotonic() - started


def mneme(*argv: str) -> subprocess.CompletedProcess:
    """A fresh `mneme` process (nothing of an earlier replay is mapped in it)."""
    return subprocess.run([sys.executable, "-m", "mneme", *argv], env=child_env(), capture_output=True, text=True,
                          timeout=300)


def instances(rdb: Path) -> list[tuple[Path, object]]:
    out = []
    for path in sorted(rdb.glob("*.json")):
        rec = RecordedExecution.from_json(path)
        out += [(path, inst) for inst in rec.instances.values()]
    return out


def assert_same_application_run(plain: subprocess.CompletedProcess, recorded: subprocess.CompletedProcess):
    assert recorded.stdout == plain.stdout, (plain.stdout, recorded.stdout, recorded.stderr[-3000:])
    assert recorded.returncode == plain.returncode, recorded.stderr[-3000:]
    assert "mneme record: error" not in recorded.stderr, recorded.stderr[-3000:]


@pytest.mark.parametrize(
    "name,args,abandon_ok",
    [
        ("threads_managed", [4, 2, 8], False),
        ("threads_managed_cublas", [4, 2, 8], False),  # the lead's reproduction: 'no earlier piece has its digest'
        ("threads_managed_cublas", [8, 4, 16], False),
        ("threads_omp", [4, 4, 50], False),
        ("threads_omp_cublas", [4, 4, 50], False),  # the shape of the application that hung
        ("threads_omp_cublas", [4, 4, 20, 262144, 256], True),  # 1 GB of managed matrices, host threads writing
        ("threads_streams", [8, 4, "managed"], False),
    ],
)
def test_threaded_program_finishes_under_record_with_its_output_unchanged(
    recorder_lib, threads, tmp_path, name, args, abandon_ok  # noqa: F811
):
    command = [program(threads, name), *args]
    plain = run_plain(command)
    assert plain.returncode == 0 and ": ok" in plain.stdout, plain.stdout + plain.stderr
    rec, seconds = record(recorder_lib, tmp_path / "rdb", command)
    assert_same_application_run(plain, rec)
    assert "recorded " in rec.stderr, rec.stderr[-3000:]
    found = instances(tmp_path / "rdb")
    assert found, rec.stderr[-3000:]
    abandoned = [inst for _, inst in found if not inst.supported]
    if not abandon_ok:
        assert not abandoned, [inst.unsupported for inst in abandoned]
    print(f"{name} {args}: {len(found)} instances ({len(abandoned)} abandoned) in {seconds:.1f} s")


@pytest.mark.parametrize("memory", ["device", "managed"])
def test_eight_threads_on_eight_streams_every_instance_verifies(recorder_lib, threads, tmp_path, memory):  # noqa: F811
    command = [program(threads, "threads_streams"), 8, 4, memory]
    plain = run_plain(command)
    rec, _ = record(recorder_lib, tmp_path / "rdb", command, "--kernel", "mix", "-mr", "0")
    assert_same_application_run(plain, rec)
    found = instances(tmp_path / "rdb")
    # One instance per thread: its 4 launches have the same arguments (duplicates are not recorded again).
    assert len(found) == 8, (len(found), rec.stderr[-3000:])
    salts = set()
    for db, inst in found:
        assert inst.supported, inst.unsupported
        salts.add(inst.arguments[16:20])  # the thread's salt
        relocate = ("--no-relocate",) if memory == "device" else ()
        replay = mneme("replay", "-rdb", str(db), "-rid", inst.record_id, "--json", *relocate)
        assert replay.returncode == 0, (replay.stdout[-2000:], replay.stderr[-2000:])
        result = json.loads(replay.stdout)["Result"]
        assert result["verified"], (inst.record_id, result)
    assert len(salts) == 8


def assert_abandoned_and_refused(rdb: Path, reason_part: str, recorded_stderr: str):
    found = instances(rdb)
    abandoned = [(db, inst) for db, inst in found if not inst.supported]
    assert abandoned, recorded_stderr[-3000:]
    # The stalled phase's own instance names it; other threads' launches waiting behind that job when their
    # deadline passed are abandoned too, with their own reason.
    assert any(reason_part in r for _, inst in abandoned for r in inst.unsupported), [i.unsupported for _, i in abandoned]
    for db, inst in abandoned:
        assert any("the recorder abandoned this launch" in r for r in inst.unsupported), inst.unsupported
        replay = mneme("replay", "-rdb", str(db), "-rid", inst.record_id)
        assert replay.returncode == 2 and "the recorder abandoned this launch" in replay.stderr, replay.stderr[-2000:]
        assert "CUDA_ERROR" not in replay.stderr
    listing = mneme("ls", str(rdb))
    assert f"{len(abandoned)} unsupported" in " ".join(listing.stdout.split()), listing.stdout
    assert "abandoned at a deadline and written unsupported" in recorded_stderr


@pytest.mark.parametrize(
    "phase,reason",
    [("prologue", "the prologue snapshot"), ("epilogue", "the epilogue snapshot")],
)
@pytest.mark.parametrize("nthreads", [1, 8])
def test_a_forced_deadline_abandons_the_instance_and_the_application_is_unchanged(
    recorder_lib, threads, tmp_path, nthreads, phase, reason  # noqa: F811
):
    """MNEME_DEBUG_STALL_SNAPSHOT_MS stalls every snapshot of the phase for 3 s; the deadline is 1 s."""
    command = [program(threads, "threads_streams"), nthreads, 4]
    plain = run_plain(command)
    started = time.monotonic()
    rec, seconds = record(recorder_lib, tmp_path / "rdb", command, "--deadline", "1", "-mr", "0",
                          env={"MNEME_DEBUG_STALL_SNAPSHOT_MS": "3000", "MNEME_DEBUG_STALL_PHASE": phase})
    assert_same_application_run(plain, rec)
    assert_abandoned_and_refused(tmp_path / "rdb", reason, rec.stderr)
    # At most 3 abandoned instances (MNEME_RECORD_MAX_ABANDONED), each costing about the deadline plus the grace
    # of the threads waiting for it: the application is never held for the stall itself, let alone forever.
    assert seconds < 60, (seconds, time.monotonic() - started)
    print(f"threads_streams {nthreads} ({phase} stalled): {seconds:.1f} s under mneme record")


@pytest.mark.parametrize(
    "kernel,reason",
    [
        ("quick", "the work queued before the launch did not finish within 1.0 s"),
        ("spin", "the launch did not finish within 1.0 s"),
    ],
)
def test_a_kernel_running_past_the_deadline_is_abandoned_and_the_application_goes_on(
    recorder_lib, threads, tmp_path, kernel, reason  # noqa: F811
):
    """A 3 s kernel: recording the quick kernel launched after it waits for it before the prologue, recording the
    kernel itself waits for it at the epilogue; both pass the 1 s deadline."""
    command = [program(threads, "slow_kernels"), 3000]
    plain = run_plain(command)
    rec, seconds = record(recorder_lib, tmp_path / "rdb", command, "--deadline", "1", "--kernel", kernel)
    assert_same_application_run(plain, rec)
    assert_abandoned_and_refused(tmp_path / "rdb", reason, rec.stderr)
    assert seconds < 30, seconds


def test_without_a_deadline_passing_the_slow_kernel_is_recorded(recorder_lib, threads, tmp_path):  # noqa: F811
    command = [program(threads, "slow_kernels"), 1500]
    plain = run_plain(command)
    rec, _ = record(recorder_lib, tmp_path / "rdb", command, "--deadline", "10")
    assert_same_application_run(plain, rec)
    found = instances(tmp_path / "rdb")
    assert len(found) == 2 and all(inst.supported for _, inst in found), rec.stderr[-3000:]
