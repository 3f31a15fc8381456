"""Spool entries -> recordings (CPU): the agent's conversion against the spool contract."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest

from mneme.errors import ArtifactError
from mneme.format import RecorderInfo
from mneme.format.hashing import static_hash
from mneme.recording.execution import RecordedExecution
from mneme.store import open_store
from mneme.testing import vecadd_code
from record_agent.convert import SpoolConverter, pointer_offsets, verify_policy
from record_agent.spool import read_entry
from record_agent.testing import (
    KERNEL,
    WINDOW,
    vecadd_arrays,
    write_entry,
    write_module,
)


def convert_all(spool, out, **kw):
    conv = SpoolConverter(spool, open_store(out), executable=None, recorder=RecorderInfo("t", "host", None, "2026-01-01T00:00:00Z", ("app",)), **kw)
    conv.convert_ready()
    return conv


def test_entry_becomes_a_database_with_exact_snapshots(tmp_path):
    spool, out = tmp_path / "spool", tmp_path / "out"
    write_module(spool)
    entry_dir = write_entry(spool, 0, n=256)
    conv = convert_all(spool, out)
    assert not entry_dir.exists()  # deleted once stored
    static = static_hash(KERNEL, vecadd_code.PTX)
    rec = RecordedExecution.from_json(out / f"{static}.json")
    assert rec.kernel_name == KERNEL and rec.address_space.mode == "fixed" and rec.address_space.base == WINDOW
    assert rec.load_code("ptx") == vecadd_code.PTX.encode() and rec.load_code("cubin") == vecadd_code.CUBIN
    assert [p.kind for p in rec.kernel.params] == ["pointer", "pointer", "pointer", "scalar"]
    (inst,) = rec.instances.values()
    assert inst.pointer_args == (0, 8, 16) and inst.grid_dim.x == 1 and inst.block_dim.x == 256
    a, b, c0, c1 = vecadd_arrays(256)
    pro = {r.base: r.read(rec.store) for r in inst.load_prologue().regions}
    epi = {r.base: r.read(rec.store) for r in inst.load_epilogue().regions}
    assert pro[WINDOW] == a and epi[WINDOW + 1024] == b and pro[WINDOW + 2048] == c0 and epi[WINDOW + 2048] == c1
    assert conv.stats.instances == 1 and conv.stats.kernels == {KERNEL}


def test_same_launch_twice_gets_distinct_occurrences(tmp_path):
    spool, out = tmp_path / "spool", tmp_path / "out"
    write_module(spool)
    write_entry(spool, 0, k=0, launch_index=0)
    write_entry(spool, 1, k=1, launch_index=3)
    convert_all(spool, out)
    (db,) = out.glob("*.json")
    rec = RecordedExecution.from_json(db)
    assert sorted((i.launch_index, i.record.occurrence) for i in rec.instances.values()) == [(0, 0), (3, 1)]


def test_launches_that_differ_only_in_launch_attributes_are_distinct_instances(tmp_path):
    spool, out = tmp_path / "spool", tmp_path / "out"
    write_module(spool)
    cluster = [{"id": 4, "name": "cluster_dim", "value": [4, 1, 1]}]
    write_entry(spool, 0, launch_index=0, attributes=cluster)
    write_entry(spool, 1, launch_index=1, attributes=[{"id": 4, "name": "cluster_dim", "value": [2, 1, 1]}])
    write_entry(spool, 2, launch_index=2)
    write_entry(spool, 3, launch_index=3, attributes=cluster)
    convert_all(spool, out)
    (db,) = out.glob("*.json")
    rec = RecordedExecution.from_json(db)
    seen = sorted(
        (i.launch_index, i.record.occurrence, tuple(a.value for a in i.record.launch_attributes))
        for i in rec.instances.values()
    )
    assert seen == [(0, 0, ((4, 1, 1),)), (1, 0, ((2, 1, 1),)), (2, 0, ()), (3, 1, ((4, 1, 1),))]


def test_recording_again_into_the_same_directory_keeps_earlier_instances(tmp_path):
    out = tmp_path / "out"
    for run in range(2):
        spool = tmp_path / f"spool{run}"
        write_module(spool)
        write_entry(spool, 0, k=run, launch_index=run)
        convert_all(spool, out)
    (db,) = out.glob("*.json")
    assert len(RecordedExecution.from_json(db).instances) == 2


def test_ptx_from_the_executable_when_the_module_source_was_not_seen(tmp_path, monkeypatch):
    spool, out = tmp_path / "spool", tmp_path / "out"
    write_module(spool, with_ptx_source=False)
    write_entry(spool, 0)
    from record_agent import fatbin

    monkeypatch.setattr(fatbin, "executable_fatbin", lambda path: b"not a fatbin")
    convert_all(spool, out)
    rec = RecordedExecution.from_json(next(out.glob("*.json")))
    # No PTX found: the cubin identifies the kernel and the instance says why.
    assert rec.static_hash == static_hash(KERNEL, vecadd_code.CUBIN)
    (inst,) = rec.instances.values()
    assert any("no PTX" in w for w in inst.warnings)


def test_a_cubin_module_takes_its_ptx_from_tritons_cache_when_the_cubin_is_the_cached_one(tmp_path):
    spool, out, cache = tmp_path / "spool", tmp_path / "out", tmp_path / "triton"
    write_module(spool, with_ptx_source=False)
    write_entry(spool, 0)
    other, match = cache / "aaaa", cache / "bbbb"
    for d in (other, match):
        d.mkdir(parents=True)
        (d / f"{KERNEL}.ptx").write_text(vecadd_code.PTX)
    (other / f"{KERNEL}.cubin").write_bytes(vecadd_code.CUBIN[:-1] + b"x")  # another specialization
    (match / f"{KERNEL}.cubin").write_bytes(vecadd_code.CUBIN)
    (other / f"{KERNEL}.ptx").write_text(vecadd_code.PTX.replace(".entry", "// another\n.entry"))
    convert_all(spool, out, env={"TRITON_CACHE_DIR": str(cache)})
    rec = RecordedExecution.from_json(next(out.glob("*.json")))
    assert rec.code.ptx is not None and rec.load_code("ptx").decode() == vecadd_code.PTX
    (inst,) = rec.instances.values()
    assert not any("no PTX" in w for w in inst.warnings)


def test_window_not_reserved_marks_the_recording_relocatable(tmp_path):
    spool, out = tmp_path / "spool", tmp_path / "out"
    write_module(spool)
    write_entry(spool, 0, window_reserved=False)
    convert_all(spool, out)
    rec = RecordedExecution.from_json(next(out.glob("*.json")))
    assert rec.address_space.mode == "relocatable"
    (inst,) = rec.instances.values()
    assert any("relocate" in w for w in inst.warnings)


def test_declared_policy_and_globals_reach_the_snapshot(tmp_path):
    spool, out = tmp_path / "spool", tmp_path / "out"
    write_module(spool, globals_=("scale",))
    g = struct.pack("<f", 2.5)
    write_entry(spool, 0, policy={"dtype": "float32", "mode": "relative", "threshold": 1e-6, "norm": "max"},
                extra_regions=[("global", "scale", 0x7FFF00000000, g, g)])
    convert_all(spool, out)
    rec = RecordedExecution.from_json(next(out.glob("*.json")))
    (inst,) = rec.instances.values()
    regions = {r.name: r for r in inst.load_epilogue().regions}
    assert regions["scale"].kind == "global" and regions["scale"].read(rec.store) == g
    c = next(r for r in regions.values() if r.base == WINDOW + 2048)
    assert (c.policy.dtype, c.policy.mode, c.policy.threshold, c.policy.norm) == ("f32", "relative", 1e-6, "none")


def test_unfinished_entries_are_ignored(tmp_path):
    spool, out = tmp_path / "spool", tmp_path / "out"
    write_module(spool)
    tmp_entry = write_entry(spool, 0, committed=False)
    conv = convert_all(spool, out)
    assert conv.stats.instances == 0 and tmp_entry.exists() and not list(out.glob("*.json"))


def test_truncated_snapshot_is_a_clear_error_and_nothing_is_written(tmp_path):
    spool, out = tmp_path / "spool", tmp_path / "out"
    write_module(spool)
    d = write_entry(spool, 0)
    (d / "epilogue.1.bin").write_bytes((d / "epilogue.1.bin").read_bytes()[:100])
    with pytest.raises(ArtifactError, match="epilogue.1.bin holds 100 bytes"):
        convert_all(spool, out)
    assert not list(out.glob("*.json"))


def test_malformed_launch_json_names_the_entry(tmp_path):
    spool = tmp_path / "spool"
    write_module(spool)
    d = write_entry(spool, 0)
    data = json.loads((d / "launch.json").read_text())
    del data["grid"]
    (d / "launch.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=str(d)):
        read_entry(d)


def test_pointer_words_inside_structs_are_found(tmp_path):
    spool = tmp_path / "spool"
    d = write_entry(spool, 0)
    entry = read_entry(d)
    struct_arg = struct.pack("<QQqQ", WINDOW + 16, 12345, -1, WINDOW + 1024 + 4)
    assert pointer_offsets(struct_arg, entry) == (0, 24)


def test_policy_spellings():
    assert verify_policy(None) is None
    p = verify_policy({"dtype": "f64", "mode": "absolute", "threshold": 0.5, "norm": "l2"})
    assert (p.dtype, p.norm) == ("f64", "l2")
    with pytest.raises(ArtifactError):
        verify_policy({"dtype": "complex", "mode": "absolute"})


def test_each_gpu_gets_its_own_databases(tmp_path):
    spool, out = tmp_path / "spool", tmp_path / "out"
    write_module(spool)
    write_entry(spool, 0, device=0)
    write_entry(spool, 1, device=1, k=1)
    conv = convert_all(spool, out)
    (db0,) = out.glob("*.json")
    (db1,) = (out / "device1").glob("*.json")
    assert db0.name == db1.name and len(RecordedExecution.from_json(db1).instances) == 1
    assert conv.stats.databases == {db0.name, f"device1/{db1.name}"}


def test_region_split_over_stripes_reads_back_whole(tmp_path):
    """A 40 MiB region in 16 MiB pieces over 3 stripe files, as the recorder writes big regions."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    write_module(spool)
    d = write_entry(spool, 0, n=256)
    meta = json.loads((d / "launch.json").read_text())
    piece = 16 << 20
    size = 40 << 20
    data_pro = bytes(range(256)) * (size // 256)
    data_epi = data_pro[::-1]
    base = 0x7F0010000000
    sizes = [piece, piece, size - 2 * piece]
    offsets = [0, 0, 0]
    stripes = [2, 3, 4]  # new stripe files beside the factory's 0 and 1
    meta["stripes"] = 5
    meta["regions"].append({"kind": "heap", "name": "", "base": base, "size": size,
                            "pieces": [[k, o, n] for k, o, n in zip(stripes, offsets, sizes)]})
    meta["allocations"].append({"base": base, "size": size, "in_window": True})
    (d / "launch.json").write_text(json.dumps(meta))
    pos = 0
    for k, n in zip(stripes, sizes):
        (d / f"prologue.{k}.bin").write_bytes(data_pro[pos:pos + n])
        (d / f"epilogue.{k}.bin").write_bytes(data_epi[pos:pos + n])
        pos += n
    convert_all(spool, out)
    rec = RecordedExecution.from_json(next(out.glob("*.json")))
    (inst,) = rec.instances.values()
    pro = {r.base: r for r in inst.load_prologue().regions}
    epi = {r.base: r for r in inst.load_epilogue().regions}
    assert pro[base].read(rec.store) == data_pro and epi[base].read(rec.store) == data_epi


def test_pieces_the_recorder_did_not_copy_take_the_chunks_of_their_digest(tmp_path):
    """Unchanged memory stays on the GPU: the epilogue's inputs and the next launch's prologue are holes."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    write_module(spool)
    seen: set = set()
    write_entry(spool, 0, n=256, k=0, digests=seen)
    second = write_entry(spool, 1, n=256, k=1, launch_index=1, digests=seen)
    meta = json.loads((second / "launch.json").read_text())
    skipped = {(r["base"], phase) for r in meta["regions"] for phase in ("prologue", "epilogue") if r[phase]["skipped"]}
    assert len(skipped) == 5  # a, b in both phases, and c's prologue (= the first launch's epilogue)
    conv = convert_all(spool, out)
    rec = RecordedExecution.from_json(next(out.glob("*.json")))
    for inst in rec.instances.values():
        k = inst.launch_index
        a, b, c0, c1 = vecadd_arrays(256, k)
        assert [r.read(rec.store) for r in inst.load_prologue().regions] == [a, b, c0]
        assert [r.read(rec.store) for r in inst.load_epilogue().regions] == [a, b, c1]
    assert conv.stats.entries[1].pipeline.unchanged_bytes == 5 * 1024


def test_a_hole_whose_digest_the_agent_never_saw_is_a_clear_error(tmp_path):
    spool, out = tmp_path / "spool", tmp_path / "out"
    write_module(spool)
    seen = {hashlib.sha1(vecadd_arrays(256)[0]).hexdigest()[:32]}  # "captured" by an entry the agent never got
    write_entry(spool, 0, n=256, digests=seen)
    with pytest.raises(ArtifactError, match="was not copied, and no earlier piece has its digest"):
        convert_all(spool, out)
    assert not list(out.glob("*.json"))
