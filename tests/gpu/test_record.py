"""`mneme record` on real CUDA programs: record them unmodified, then check the
databases and snapshots against values computed on the host.

Programs: examples/vecadd (static and shared cudart) and tests/gpu/programs/
(a __device__/__constant__ global reader, a struct-of-pointers linked-list
walker, an iterative two-kernel solver with cudaMallocAsync/cudaMallocPitch/
cudaLaunchKernelExC, a driver-API PTX module, a program that crashes).

The recorder library comes from MNEME_RECORDER_LIB, the installed package, or
is built here with CMake (the `mneme_recorder` target).
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from mneme.format.layout import is_hash_id
from mneme.recording.execution import RecordedExecution
from mneme.recording.window import DEFAULT_VA_BASE, FALLBACK_VA_BASES
from mneme.testing.gpu import child_env  # noqa: E402

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).resolve().parent / "programs"
#: Where the recorder may go when the default window's range is taken in the process (then it says so).
WINDOWS = (DEFAULT_VA_BASE, *FALLBACK_VA_BASES)


def _nvcc() -> str:
    found = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(found).exists():
        pytest.skip("nvcc not found: the recording tests build CUDA programs")
    return found


@pytest.fixture(scope="session")
def recorder_lib(tmp_path_factory) -> str:
    if os.environ.get("MNEME_RECORDER_LIB"):
        return os.environ["MNEME_RECORDER_LIB"]
    installed = Path(__import__("mneme").__file__).parent / "lib" / "libmneme_recorder.so"
    if installed.exists():
        return str(installed)
    build = tmp_path_factory.mktemp("recorder-build")
    (build / "src").mkdir()
    (build / "src" / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(recorder_only CXX)\n"
        f"add_subdirectory({ROOT / 'native' / 'common'} common)\n"
        f"add_subdirectory({ROOT / 'native' / 'recorder'} recorder)\n"
    )
    subprocess.run(["cmake", "-S", build / "src", "-B", build / "b", "-DCMAKE_BUILD_TYPE=Release"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", build / "b", "-j8"], check=True, capture_output=True)
    return str(build / "b" / "recorder" / "libmneme_recorder.so")


@pytest.fixture(scope="session")
def programs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("programs")
    nvcc = _nvcc()
    subprocess.run(["make", "-s", "-C", PROGRAMS, f"OUTDIR={out}", f"NVCC={nvcc}"], check=True)
    subprocess.run(["make", "-s", "-C", ROOT / "examples" / "vecadd", f"NVCC={nvcc}", "vecadd", "vecadd_shared"], check=True)
    for name in ("vecadd", "vecadd_shared"):
        shutil.copy(ROOT / "examples" / "vecadd" / name, out / name)
    return out


def mneme_record(recorder_lib: str, rdb: Path, command: list, *options: str, check_rc: int | None = 0) -> subprocess.CompletedProcess:
    env = child_env(MNEME_RECORDER_LIB=recorder_lib)
    proc = subprocess.run(
        [sys.executable, "-m", "mneme", "record", "-rdb", str(rdb), *options, "--", *map(str, command)],
        env=env, capture_output=True, text=True, timeout=240,
    )
    if check_rc is not None:
        assert proc.returncode == check_rc, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def only_database(rdb: Path, kernel_substring: str) -> RecordedExecution:
    found = []
    for db in sorted(rdb.glob("*.json")):
        rec = RecordedExecution.from_json(db)
        if kernel_substring in rec.kernel_name:
            found.append(rec)
    assert len(found) == 1, f"expected one database for {kernel_substring} in {rdb}: {[p.name for p in rdb.iterdir()]}"
    return found[0]


def regions(snapshot, store) -> dict[int, bytes]:
    return {r.base: r.read(store) for r in snapshot.regions}


def floats(data: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(data) // 4}f", data))


@pytest.mark.parametrize("program", ["vecadd", "vecadd_shared"])
def test_vecadd_recording_matches_host_values(recorder_lib, programs, tmp_path, program):
    n = 4096
    proc = mneme_record(recorder_lib, tmp_path / "rdb", [programs / program, n, 3])
    assert "vecadd n=4096 iterations=3: ok" in proc.stdout  # the application's own output, unchanged
    rec = only_database(tmp_path / "rdb", "vecadd")
    assert rec.kernel_name == "_Z6vecaddPKfS0_Pfi" and is_hash_id(rec.static_hash)
    base = rec.address_space.base
    assert rec.address_space.mode == "fixed" and base in WINDOWS, proc.stderr
    assert set(rec.code.refs()) >= {"ptx", "cubin"}
    assert b".entry _Z6vecaddPKfS0_Pfi" in rec.load_code("ptx")
    assert rec.load_code("cubin")[:4] == b"\x7fELF"
    # Three launches with the same arguments: one distinct instance.
    assert len(rec.instances) == 1
    inst = next(iter(rec.instances.values()))
    assert (inst.grid_dim.x, inst.block_dim.x, inst.shared_mem) == (n // 256, 256, 0)
    a_ptr, b_ptr, c_ptr, count = struct.unpack("<QQQi", inst.arguments[:28])
    assert count == n and inst.pointer_args == (0, 8, 16)
    assert [a_ptr, b_ptr, c_ptr] == [base, base + 4 * n, base + 8 * n]
    pro = regions(inst.load_prologue(), rec.store)
    epi = regions(inst.load_epilogue(), rec.store)
    a = [i * 0.5 for i in range(n)]
    b = [2.0 - i * 0.25 for i in range(n)]
    assert floats(pro[a_ptr]) == a and floats(pro[b_ptr]) == b
    assert floats(pro[c_ptr]) == [0.0] * n
    assert floats(epi[c_ptr]) == [x + y for x, y in zip(a, b)]
    assert epi[a_ptr] == pro[a_ptr]


def test_globals_are_captured_per_instance(recorder_lib, programs, tmp_path):
    mneme_record(recorder_lib, tmp_path / "rdb", [programs / "globals"])
    rec = only_database(tmp_path / "rdb", "scaled_copy")
    assert len(rec.instances) == 1  # same arguments twice: the second launch is a duplicate
    inst = next(iter(rec.instances.values()))
    pro, epi = inst.load_prologue(), inst.load_epilogue()
    by_name = {r.name: r for r in pro.regions if r.kind == "global"}
    assert set(by_name) == {"scale", "offsets", "launches"}
    assert struct.unpack("<f", by_name["scale"].read(rec.store)) == (1.5,)
    assert struct.unpack("<4i", by_name["offsets"].read(rec.store)) == (1, 2, 3, 4)
    assert struct.unpack("<I", by_name["launches"].read(rec.store)) == (0,)
    epi_globals = {r.name: r.read(rec.store) for r in epi.regions if r.kind == "global"}
    assert struct.unpack("<I", epi_globals["launches"]) == (1,)
    in_ptr, out_ptr = struct.unpack("<QQ", inst.arguments[:16])
    out = floats(regions(epi, rec.store)[out_ptr])
    assert out == [i * 1.5 + (1, 2, 3, 4)[i % 4] for i in range(1000)]


def test_linked_list_in_device_memory_and_reachable_scope(recorder_lib, programs, tmp_path):
    for scope in ("all", "reachable"):
        rdb = tmp_path / scope
        mneme_record(recorder_lib, rdb, [programs / "linked_list"], "--snapshot-scope", scope)
        rec = only_database(rdb, "walk")
        inst = next(iter(rec.instances.values()))
        head, sum_ptr, unused_ptr, tag = struct.unpack("<QQQq", inst.arguments)
        assert tag == 42 and inst.pointer_args == (0, 8, 16)
        pro, epi = regions(inst.load_prologue(), rec.store), regions(inst.load_epilogue(), rec.store)
        nodes_base = head - 9 * 16
        assert nodes_base in pro
        # Walk the list on the host, through the recorded memory: the stored pointers are window addresses.
        total, node = 0, head
        while node:
            (value,) = struct.unpack_from("<i", pro[nodes_base], node - nodes_base)
            (node,) = struct.unpack_from("<Q", pro[nodes_base], node - nodes_base + 8)
            total += value
        assert total == 55
        assert struct.unpack("<i", epi[sum_ptr]) == (55,)
        sizes = sorted(len(v) for v in pro.values())
        if scope == "all":
            assert 3 << 20 in sizes  # the unreachable allocation is in a whole-heap snapshot
        else:
            assert 3 << 20 not in sizes and sorted(pro) == sorted([nodes_base, sum_ptr, unused_ptr])


def test_iterative_instances_selection_and_allocators(recorder_lib, programs, tmp_path):
    rdb = tmp_path / "rdb"
    mneme_record(
        recorder_lib, rdb, [programs / "iterative", 12],
        "--kernel", "relax", "--instances", "0,5:10:2", "-mr", "0", "--record-duplicates",
    )
    names = [RecordedExecution.from_json(p).kernel_name for p in rdb.glob("*.json")]
    assert names == ["_Z5relaxPfPKfi"]
    rec = only_database(rdb, "relax")
    by_index = {i.launch_index: i for i in rec.instances.values()}
    assert sorted(by_index) == [0, 5, 7, 9]
    assert len({i.record.occurrence for i in by_index.values()}) == 4  # same arguments, told apart by occurrence
    for k, inst in by_index.items():
        x_ptr = struct.unpack("<Q", inst.arguments[:8])[0]
        x0 = floats(regions(inst.load_prologue(), rec.store)[x_ptr])
        x1 = floats(regions(inst.load_epilogue(), rec.store)[x_ptr])
        assert x0[0] == 1 - 0.5**k and x1[-1] == 1 - 0.5 ** (k + 1)

    # Default selection: every kernel, cudaMallocAsync buffers, the pitched buffer of the cudaLaunchKernelExC launch.
    rdb2 = tmp_path / "all"
    mneme_record(recorder_lib, rdb2, [programs / "iterative", 3])
    fill = only_database(rdb2, "fill_pitched")
    inst = next(iter(fill.instances.values()))
    ptr, pitch, w, h = struct.unpack("<QQii", inst.arguments)
    base = fill.address_space.base
    assert pitch == 512 and (w, h) == (100, 8) and base <= ptr < base + (4 << 30)
    data = regions(inst.load_epilogue(), fill.store)[ptr]
    assert struct.unpack_from("<f", data, 7 * pitch + 99 * 4) == (7099.0,)
    relax = only_database(rdb2, "relax")
    assert len(relax.instances) == 1  # identical launches are not recorded twice by default


def test_driver_api_ptx_module(recorder_lib, programs, tmp_path):
    mneme_record(recorder_lib, tmp_path / "rdb", [programs / "driver_ptx"])
    rec = only_database(tmp_path / "rdb", "saxpy")
    source = (PROGRAMS / "driver_ptx.cu").read_text()
    ptx = rec.load_code("ptx").decode()
    assert ".entry saxpy(" in ptx and ptx.strip() in source
    inst = next(iter(rec.instances.values()))
    a, x_ptr, y_ptr, n = struct.unpack("<f4xQQI", inst.arguments[:28])
    assert a == 3.0 and n == 2048 and inst.pointer_args == (8, 16)
    y = floats(regions(inst.load_epilogue(), rec.store)[y_ptr])
    assert y == [3.0 * i + 1.0 for i in range(n)]


@pytest.mark.parametrize("how,status", [("SEGV", 128 + signal.SIGSEGV), ("KILL", 128 + signal.SIGKILL)])
def test_crash_keeps_what_was_recorded(recorder_lib, programs, tmp_path, how, status):
    proc = mneme_record(recorder_lib, tmp_path / "rdb", [programs / "crash_after_launch", how], check_rc=status)
    assert "crash_after_launch: launched" in proc.stdout
    rec = only_database(tmp_path / "rdb", "square")
    inst = next(iter(rec.instances.values()))
    v_ptr = struct.unpack("<Q", inst.arguments[:8])[0]
    assert struct.unpack("<256i", regions(inst.load_epilogue(), rec.store)[v_ptr]) == tuple(i * i for i in range(256))


def test_filter_that_matches_nothing_records_nothing(recorder_lib, programs, tmp_path):
    proc = mneme_record(recorder_lib, tmp_path / "rdb", [programs / "vecadd", 1024, 2], "--kernel", "^no_such_kernel$")
    assert "nothing recorded" in proc.stderr and not list((tmp_path / "rdb").glob("*.json"))


def test_unselected_rank_runs_the_application_unrecorded(recorder_lib, programs, tmp_path):
    env_before = os.environ.get("OMPI_COMM_WORLD_RANK")
    os.environ["OMPI_COMM_WORLD_RANK"] = "1"
    try:
        proc = mneme_record(recorder_lib, tmp_path / "rdb", [programs / "vecadd", 1024, 1])
        windows = tuple(f"ok (a={w:#x}" for w in WINDOWS)
        assert not any(w in proc.stdout for w in windows)  # driver addresses: the recorder is not loaded
        rank2 = mneme_record(recorder_lib, tmp_path / "rdb", [programs / "vecadd", 1024, 1], "-rr", "all")
        assert any(w in rank2.stdout for w in windows)
        assert list((tmp_path / "rdb" / "rank1").glob("*.json"))
    finally:
        if env_before is None:
            os.environ.pop("OMPI_COMM_WORLD_RANK", None)
        else:
            os.environ["OMPI_COMM_WORLD_RANK"] = env_before


def test_annotated_policy_reaches_the_recording(recorder_lib, programs, tmp_path):
    proc = mneme_record(recorder_lib, tmp_path / "rdb", [programs / "annotated"])
    assert "annotate returned 0" in proc.stdout
    rec = only_database(tmp_path / "rdb", "softish")
    inst = next(iter(rec.instances.values()))
    y_ptr = struct.unpack("<QQ", inst.arguments[:16])[1]
    policies = {r.base: r.policy for r in inst.load_epilogue().regions}
    assert (policies[y_ptr].dtype, policies[y_ptr].mode, policies[y_ptr].threshold, policies[y_ptr].norm) == ("f32", "relative", 1e-5, "linf")
    x_ptr = struct.unpack("<Q", inst.arguments[:8])[0]
    assert policies[x_ptr] is None


def test_managed_memory_and_a_captured_graph_kernel_are_recorded(recorder_lib, programs, tmp_path):
    proc = mneme_record(recorder_lib, tmp_path / "rdb", [programs / "unsupported"], "-mr", "0", "--record-duplicates")
    assert "managed[0]=1" in proc.stdout
    assert "captured into a CUDA graph is recorded when the graph is launched" in proc.stderr
    rec = only_database(tmp_path / "rdb", "bump")
    # The direct launch, and the captured one, recorded when the graph ran node by node; both on managed memory
    # (captured: no warning, both replayable).
    assert len(rec.instances) == 2 and all(inst.supported for inst in rec.instances.values()), rec.instances
    assert not any("managed memory" in w for inst in rec.instances.values() for w in inst.warnings)


def test_several_gpus_in_one_process(recorder_lib, programs, tmp_path):
    import ctypes

    count = ctypes.c_int(0)
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuInit(0)
    cuda.cuDeviceGetCount(ctypes.byref(count))
    if count.value < 2:
        pytest.skip("needs two GPUs")
    proc = mneme_record(recorder_lib, tmp_path / "rdb", [programs / "multi_gpu"])
    window = 4 << 30
    base0 = only_database(tmp_path / "rdb", "fill").address_space.base
    for device in range(count.value):
        rec = only_database(tmp_path / "rdb" / (f"device{device}" if device else ""), "fill")
        assert rec.device.ordinal == device and rec.address_space.base == base0 + device * window
        (inst,) = rec.instances.values()
        ptr, n, value = struct.unpack("<Qii", inst.arguments)
        assert value == 1000 * (device + 1) and ptr == base0 + device * window, proc.stdout
        data = regions(inst.load_epilogue(), rec.store)[ptr]
        assert struct.unpack(f"<{n}i", data) == tuple(value + i for i in range(n))


def test_full_spool_disk_ends_recording_with_a_clear_message(recorder_lib, programs, tmp_path):
    """The spool on a 1 MiB filesystem: the first 12 MiB snapshot does not fit."""
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("needs to mount a small tmpfs (root)")
    try:
        env_before = os.environ.get("MNEME_SPOOL_PARENT")
        os.environ["MNEME_SPOOL_PARENT"] = str(small)
        proc = mneme_record(recorder_lib, tmp_path / "rdb", [programs / "vecadd", 1 << 20, 1], check_rc=2)
    finally:
        if env_before is None:
            os.environ.pop("MNEME_SPOOL_PARENT", None)
        else:
            os.environ["MNEME_SPOOL_PARENT"] = env_before
        subprocess.run(["umount", str(small)], check=False)
    assert "vecadd n=1048576 iterations=1: ok" in proc.stdout  # the application ran to the end, unaffected
    assert "No space left on device" in proc.stderr and "recording stopped" in proc.stderr
    assert not list((tmp_path / "rdb").glob("*.json"))  # nothing half-written


def test_unchanged_memory_is_not_copied_again_and_the_recording_is_the_same(recorder_lib, programs, tmp_path):
    """GPU digests: after the first snapshot only changed 16 MiB pieces leave the device (a and b never
    change, c does), and the recording is byte for byte the one made copying everything."""
    import json

    n = 12 << 20  # 48 MiB per array: three pieces each
    runs = {}
    for digests in ("1", "0"):
        rdb, stats = tmp_path / f"rdb{digests}", tmp_path / f"stats{digests}.json"
        env = child_env(MNEME_RECORDER_LIB=recorder_lib, MNEME_DIGESTS=digests, MNEME_RECORD_STATS=str(stats))
        proc = subprocess.run(
            [sys.executable, "-m", "mneme", "record", "-rdb", str(rdb), "-mr", "0", "--record-duplicates", "--",
             str(programs / "vecadd"), str(n), "3"],
            env=env, capture_output=True, text=True, timeout=240,
        )
        assert proc.returncode == 0, proc.stderr
        assert "copied off the GPU" in proc.stderr and "stalled" in proc.stderr
        rec = only_database(rdb, "vecadd")
        runs[digests] = (rec, json.loads(stats.read_text()))
    (with_digests, stats1), (copy_all, stats0) = runs["1"], runs["0"]
    assert set(with_digests.instances) == set(copy_all.instances) and len(with_digests.instances) == 3
    for dyn, inst in with_digests.instances.items():
        other = copy_all.instances[dyn]
        for phase in ("load_prologue", "load_epilogue"):
            assert [r.chunks for r in getattr(inst, phase)().regions] == [r.chunks for r in getattr(other, phase)().regions]
    state = 3 * 4 * n
    assert stats0["copied_bytes"] == stats0["snapshot_bytes"] == 3 * 2 * state
    # First prologue: a, b and one piece of c (zeros: its three pieces are one); each epilogue: c's three
    # pieces; the later prologues: nothing (c as the last epilogue left it).
    piece = 16 << 20
    assert stats1["copied_bytes"] == (3 + 3 + 1) * piece + 3 * (3 * piece)
