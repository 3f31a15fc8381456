"""RecordedExecution over synthetic recordings: the API the replay and tuner use."""

import struct

import pytest

from mneme.errors import ArtifactError
from mneme.model.experiment import Dim3
from mneme.recording.execution import RecordedExecution
from mneme.testing.synthetic import WINDOW_BASE, vecadd_expected, write_vecadd_recording
from mneme.testing.vecadd_code import CUBIN, KERNEL_NAME, PTX


@pytest.fixture
def recording(tmp_path):
    return write_vecadd_recording(tmp_path / "rec", n=1000, block=128, instances=3)


def test_from_json_and_indexing(recording):
    rec = RecordedExecution.from_json(recording.path)
    assert len(rec) == 3 and list(rec) == list(recording.dynamic_hashes)
    assert rec.static_hash == recording.static_hash and rec.kernel.name == KERNEL_NAME
    kernel = rec[recording.dynamic_hash]
    assert isinstance(kernel, RecordedExecution.KernelInstance)
    assert kernel.grid_dim == Dim3(8, 1, 1) and kernel.grid_dim.x == 8
    assert kernel.block_dim.x == 128 and kernel.block_dim.y == 1 and kernel.block_dim.z == 1
    assert kernel.shared_mem == 0
    assert kernel.arguments == struct.pack("<QQQi", WINDOW_BASE, WINDOW_BASE + 4096, WINDOW_BASE + 8192, 1000)
    assert kernel.pointer_args == (0, 8, 16)
    assert kernel.prologue == f"DeviceState.prologue.{rec.static_hash}.{kernel.record_id}.mneme"
    assert kernel.kernel_name == KERNEL_NAME
    assert rec.instances.keys() == set(recording.dynamic_hashes)


def test_snapshots_hold_what_the_kernel_computes(recording):
    rec = RecordedExecution.from_json(recording.path)
    for kernel in rec.values():
        pro, epi = kernel.load_prologue(), kernel.load_epilogue()
        a, b, c0 = (r.read(rec.store) for r in pro.regions)
        assert [r.name for r in epi.regions] == ["a", "b", "c"]
        assert c0 == bytes(4000)
        assert epi.regions[2].read(rec.store) == vecadd_expected(a, b)
        assert epi.regions[0].chunks == pro.regions[0].chunks  # shared, stored once


def test_code_is_loaded_and_verified(recording):
    rec = RecordedExecution.from_json(recording.path)
    assert rec.load_code("ptx").decode() == PTX and rec.load_code("cubin") == CUBIN
    rec.check_static_hash()
    with pytest.raises(ArtifactError, match="no bitcode"):
        rec.load_code("bitcode")
    rec.store.put(rec.code.cubin.path, CUBIN[:100] + bytes([CUBIN[100] ^ 1]) + CUBIN[101:])
    fresh = RecordedExecution.from_json(recording.path)
    with pytest.raises(ArtifactError, match=r"Kernel_\d+\.cubin.*corrupt"):
        fresh.load_code("cubin")


def test_unknown_id_lists_known_ids(recording):
    rec = RecordedExecution.from_json(recording.path)
    with pytest.raises(ArtifactError) as info:
        rec["42"]
    assert "42" in str(info.value) and recording.dynamic_hash in str(info.value)
    with pytest.raises(ArtifactError, match="3 instances"):
        rec.single_instance()


def test_select_lists_the_choices_when_several_instances_and_no_id(recording):
    rec = RecordedExecution.from_json(recording.path)
    with pytest.raises(ArtifactError) as info:
        rec.select()
    message = str(info.value)
    assert "3 instances" in message and "--record-id" in message
    for record_id in recording.dynamic_hashes:
        assert f"  {record_id}  launch " in message
    assert "grid (8, 1, 1)  block (128, 1, 1)" in message
    assert rec.select(recording.dynamic_hashes[1]).record_id == recording.dynamic_hashes[1]
    with pytest.raises(ArtifactError, match="no instance 42"):
        rec.select("42")


def test_select_without_an_id_picks_the_only_instance(tmp_path):
    r = write_vecadd_recording(tmp_path, instances=1)
    assert RecordedExecution.from_json(r.path).select(None).record_id == r.dynamic_hash


def test_single_instance_and_directory_lookup(tmp_path):
    r = write_vecadd_recording(tmp_path, include_ptx=False)
    rec = RecordedExecution.from_json(tmp_path)
    assert rec.single_instance().record_id == r.dynamic_hash
    assert rec.code.ptx is None and rec.code.cubin is not None
    rec.check_static_hash()


def test_missing_database_says_what_to_check(tmp_path):
    with pytest.raises(ArtifactError, match=r"123\.json not found in .*check the recording path"):
        RecordedExecution.from_json(tmp_path / "123.json")


def test_missing_snapshot_file_is_named(recording):
    rec = RecordedExecution.from_json(recording.path)
    kernel = rec[recording.dynamic_hash]
    rec.store.delete(kernel.epilogue)
    with pytest.raises(ArtifactError, match=kernel.epilogue):
        kernel.load_epilogue()


def test_swapped_snapshot_is_detected(recording):
    rec = RecordedExecution.from_json(recording.path)
    k0, k1 = (rec[d] for d in recording.dynamic_hashes[:2])
    rec.store.put(k0.prologue, rec.store.get(k1.prologue))
    with pytest.raises(ArtifactError, match=k0.prologue):
        k0.load_prologue()
