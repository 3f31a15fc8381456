"""The recording database: round trip, validation with named fields, merging, the writer's commit."""

import copy
import json
import struct

import pytest

from mneme.errors import ArtifactError
from mneme.format.database import (
    RecordingDatabase,
    load_database,
    merge_databases,
    parse_database_bytes,
    save_database,
)
from mneme.format.hashing import dynamic_hash
from mneme.format.writer import RecordingWriter, RegionSource
from mneme.recording.execution import RecordedExecution
from mneme.store import LocalStore
from mneme.testing.synthetic import write_vecadd_recording


@pytest.fixture
def recording(tmp_path):
    return write_vecadd_recording(tmp_path, n=256, instances=2)


@pytest.fixture
def valid(recording):
    return json.loads(recording.store.get(recording.database))


def parse(value):
    return parse_database_bytes(json.dumps(value).encode(), "123.json")


def test_round_trip(recording, valid):
    db = load_database(recording.store, recording.database)
    assert db.to_dict() == valid
    assert RecordingDatabase.from_dict(db.to_dict()) == db
    assert db.name == recording.database
    inst = db.instances[recording.dynamic_hash]
    assert inst.dynamic_hash == dynamic_hash(db.static_hash, inst.grid, inst.block, inst.shared_mem, inst.args)
    assert len(db.referenced_objects()) == 2 + 2 * 2


def first(valid):
    return next(iter(valid["instances"].values()))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("kernel"), "missing key.*'kernel'"),
        (lambda d: d.update(format="other"), "format: expected 'mneme.recording'"),
        (lambda d: d.update(format_version="1"), "format_version: expected an integer"),
        (lambda d: d.update(static_hash="abc"), "static_hash: 'abc' is not a hash id"),
        (lambda d: d["kernel"].update(name=""), "kernel.name: must not be empty"),
        (lambda d: d["kernel"].update(param_buffer_size=20), r"kernel.params\[2\]: ends at 24"),
        (lambda d: d["kernel"]["params"][1].update(offset=4), r"kernel.params\[1\]: offset 4 overlaps"),
        (lambda d: d["kernel"]["params"][0].update(kind="handle"), r"kernel.params\[0\].kind"),
        (lambda d: d["kernel"]["params"][0].update(size=4), "a pointer parameter has 8 bytes"),
        (lambda d: d["code"].update(ptx=None, cubin=None), "neither PTX nor cubin"),
        (lambda d: d["code"].update(arch="gfx90a"), "code.arch"),
        (lambda d: d["code"]["cubin"].update(path="../../etc/passwd"), r"code.cubin.path: .*cannot leave the store"),
        (lambda d: d["code"]["cubin"].update(sha256="xyz"), "code.cubin.sha256"),
        (lambda d: d["code"]["cubin"].update(size=-1), "code.cubin.size"),
        (lambda d: d["device"].update(compute_capability=[9]), r"device.compute_capability: expected \[major, minor\]"),
        (lambda d: d["address_space"].update(mode="paged"), "address_space.mode"),
        (lambda d: d["recorder"].update(command="app"), "recorder.command: expected a list"),
        (lambda d: d["recorder"].update(rank=-1), "recorder.rank"),
        (lambda d: d.update(instances=[]), "instances: expected an object"),
        (lambda d: d["instances"].update(x={}), "instances.x: 'x' is not a dynamic hash id"),
        (lambda d: first(d)["grid"].pop("z"), r"instances.\d+.grid: missing key"),
        (lambda d: first(d)["block"].update(x=0), r"instances.\d+.block.x: 0 is below the minimum 1"),
        (lambda d: first(d)["block"].update(x=2048), r"instances.\d+.block.x: 2048 is above"),
        (lambda d: first(d)["grid"].update(x="4"), r"instances.\d+.grid.x: expected an integer"),
        (lambda d: first(d).update(shared_mem=-4), r"shared_mem"),
        (lambda d: first(d).update(args="zz"), r"args: expected the parameter buffer"),
        (lambda d: first(d).update(args="00 11"), r"args: expected the parameter buffer"),
        (lambda d: first(d).update(args="00"), r"args: 1 bytes, the kernel's parameter buffer has 28"),
        (lambda d: first(d).update(pointer_args=[24]), r"pointer_args\[0\]"),
        (lambda d: first(d).update(pointer_args=[8, 0]), "sorted and distinct"),
        (lambda d: first(d)["prologue"].pop("sha256"), r"prologue: missing key"),
        (lambda d: first(d).update(warnings=[1]), r"warnings\[0\]: expected a string"),
        (lambda d: first(d).update(app_kernel_time_ns=1.5), "app_kernel_time_ns"),
        (lambda d: first(d).update(occurrence=5), "has dynamic hash .*not its id"),
        (lambda d: first(d).update(args=first(d)["args"][:-2] + "01"), "has dynamic hash .*not its id"),
        (lambda d: first(d)["grid"].update(x=5), "has dynamic hash .*not its id"),
        (lambda d: first(d).update(launch_attributes=[{"id": 4, "name": "cluster_dim", "value": [2, 1, 1]}]),
         "launch attributes.*has dynamic hash .*not its id"),
        (lambda d: d.update(surprise=True), "unknown key.*'surprise'.*upgrade mneme"),
    ],
)
def test_invalid_databases_name_file_and_field(valid, mutate, message):
    bad = copy.deepcopy(valid)
    mutate(bad)
    with pytest.raises(ArtifactError, match=message) as info:
        parse(bad)
    assert str(info.value).startswith("123.json: ")


def test_newer_version_says_upgrade(valid):
    valid["format_version"] = 2
    valid["new_section"] = {}
    with pytest.raises(ArtifactError, match="123.json: format_version: .*version 2 is newer.*upgrade mneme"):
        parse(valid)


@pytest.mark.parametrize("data", [b"", b"{", b"\xff", b"[]", b"null", b'"x"', b"[" * 10000 + b"]" * 10000])
def test_not_a_database(data):
    with pytest.raises(ArtifactError, match="^x.json: "):
        parse_database_bytes(data, "x.json")


def test_truncated_database_file(recording):
    data = recording.store.get(recording.database)
    recording.store.put(recording.database, data[: len(data) // 2])
    with pytest.raises(ArtifactError, match=rf"{recording.database} in .*not valid UTF-8 JSON"):
        RecordedExecution.from_json(recording.path)


def test_renamed_database_is_detected(recording):
    recording.store.put("42.json", recording.store.get(recording.database))
    with pytest.raises(ArtifactError, match="42.json.*renamed"):
        load_database(recording.store, "42.json")


def test_instance_naming_a_missing_file(recording):
    rec = RecordedExecution.from_json(recording.path)
    name = rec[recording.dynamic_hash].prologue
    recording.store.delete(name)
    rec = RecordedExecution.from_json(recording.path)  # the database itself is fine
    with pytest.raises(ArtifactError, match=rf"{name} not found in {recording.store.url}"):
        rec[recording.dynamic_hash].load_prologue()


def test_save_refuses_invalid_database(recording, tmp_path):
    db = load_database(recording.store, recording.database)
    inst = db.instances[recording.dynamic_hash]
    import dataclasses

    broken = db.add_instance(dataclasses.replace(inst, shared_mem=1))  # no longer matches its id
    store = LocalStore(tmp_path / "other")
    with pytest.raises(ArtifactError, match="not its id"):
        save_database(store, broken)
    assert list(store.list()) == []


def test_merge_adds_instances_and_rejects_other_code(tmp_path):
    r1 = write_vecadd_recording(tmp_path / "one", n=256, seed=1)
    r2 = write_vecadd_recording(tmp_path / "two", n=512, seed=2)
    db1 = load_database(r1.store, r1.database)
    db2 = load_database(r2.store, r2.database)
    merged = merge_databases(db1, db2)
    assert set(merged.instances) == {r1.dynamic_hash, r2.dynamic_hash}
    r3 = write_vecadd_recording(tmp_path / "three", include_ptx=False)
    with pytest.raises(ArtifactError, match="cannot merge"):
        merge_databases(db1, load_database(r3.store, r3.database))
    r4 = write_vecadd_recording(tmp_path / "four", include_cubin=False)
    with pytest.raises(ArtifactError, match="different code files"):
        merge_databases(db1, load_database(r4.store, r4.database))


def test_recording_twice_into_one_directory_appends(tmp_path):
    r1 = write_vecadd_recording(tmp_path, n=256, seed=1)
    r2 = write_vecadd_recording(tmp_path, n=512, seed=2)
    assert r1.database == r2.database
    rec = RecordedExecution.from_json(tmp_path / r1.database)
    assert set(rec) == {r1.dynamic_hash, r2.dynamic_hash}
    assert rec[r2.dynamic_hash].grid_dim.x == 2


def test_writer_from_raw_region_files(tmp_path):
    store = LocalStore(tmp_path / "rec")
    raw = tmp_path / "spool.bin"
    a, c = bytes(range(256)) * 64, b"\x07" * 4096
    raw.write_bytes(a + c)
    writer = RecordingWriter(store, chunk_size=4096)
    from mneme.format.database import KernelParam, KernelSignature
    from mneme.format.hashing import static_hash
    from mneme.format.writer import new_database
    from mneme.testing.synthetic import vecadd_code

    static = static_hash("k", b"code")
    code = writer.write_code(static, cubin=vecadd_code.CUBIN)
    kernel = KernelSignature("k", "k(int*)", (KernelParam(0, 8, "pointer"),), 8)
    db = new_database(static, kernel, code)
    args = struct.pack("<Q", 0x1000)
    db, inst = writer.write_instance(
        db, grid=1, block=(32,), shared_mem=0, args=args, pointer_args=[0],
        prologue=[RegionSource(0x1000, "heap", "a", path=raw, size=len(a))],
        epilogue=[RegionSource(0x1000, "heap", "a", path=raw, offset=len(a), size=len(c))],
    )  # fmt: skip
    rec = RecordedExecution.from_json(store.url)
    k = rec[inst.dynamic_hash]
    assert k.load_prologue().regions[0].read(store) == a
    assert k.load_epilogue().regions[0].read(store) == c
    assert len(list(store.list("chunks/"))) == 2  # 4 pieces of a are equal, c is one piece
    with pytest.raises(ArtifactError, match="exactly one of data and path"):
        writer.store_region(RegionSource(0, "heap", "x"))


def test_database_is_written_last(tmp_path):
    """A reader never finds a database naming an object that is not stored yet."""
    order = []

    class Recording(LocalStore):
        def put(self, name, data):
            order.append(name)
            super().put(name, data)

    write_vecadd_recording(Recording(tmp_path), instances=2)
    assert order[-1].endswith(".json") and sum(n.endswith(".json") for n in order) == 1


def test_different_code_never_replaces_a_recorded_kernels_files(tmp_path):
    from mneme.testing.synthetic import vecadd_code

    r = write_vecadd_recording(tmp_path)
    db = load_database(r.store, r.database)
    other_cubin = vecadd_code.CUBIN + b"\0\0\0\0"
    with pytest.raises(ArtifactError, match="different code for the same kernel"):
        RecordingWriter(r.store).write_code(r.static_hash, ptx=vecadd_code.PTX, cubin=other_cubin)
    assert r.store.get(db.code.cubin.path) == vecadd_code.CUBIN
    # Without a database (an interrupted recording), stale code files are replaced.
    r.store.delete(r.database)
    code = RecordingWriter(r.store).write_code(r.static_hash, ptx=vecadd_code.PTX, cubin=other_cubin)
    assert r.store.get(code.cubin.path) == other_cubin


def test_checksum_catches_changes_the_schema_allows(valid):
    edited = copy.deepcopy(valid)
    edited["address_space"]["base"] += 4096
    with pytest.raises(ArtifactError, match="123.json: checksum: the content does not match"):
        parse(edited)
    first(edited)["pointer_args"] = [0, 8]
    edited["address_space"]["base"] -= 4096
    with pytest.raises(ArtifactError, match="checksum"):
        parse(edited)
    # An intended edit: drop the checksum (or re-save); re-indenting alone keeps it valid.
    del edited["checksum"]
    assert parse(edited).instances[next(iter(valid["instances"]))].pointer_args == (0, 8)
    assert "checksum" in parse(edited).to_dict()
    reindented = json.dumps(valid, indent=7, sort_keys=True).encode()
    assert parse_database_bytes(reindented, "123.json") == parse(valid)
