"""LocalStore and the name rules every backend applies."""

import os
import threading

import pytest

from mneme.errors import ArtifactError, NotAvailableError
from mneme.store import (
    InvalidNameError,
    LocalStore,
    open_store,
    split_recording_url,
    validate_name,
)


@pytest.mark.parametrize(
    "name",
    ["", "/abs", "a//b", "a/", "../x", "a/../b", "./a", ".hidden", "a/.tmp", "a\\b", "a b", "a\x00b",
     "x" * 600, "a/" + "y" * 300, "é"],
)  # fmt: skip
def test_bad_names_are_rejected(name):
    with pytest.raises(InvalidNameError):
        validate_name(name)
    with pytest.raises(ValueError):  # InvalidNameError is also a ValueError
        validate_name(name)


@pytest.mark.parametrize(
    "name", ["123.json", "DeviceState.prologue.1.2.mneme", "chunks/ab/" + "ab" * 32, "Kernel_1.cubin", "a-b_c+d=e@f,g~h"]
)
def test_good_names_pass(name):
    assert validate_name(name) == name


def test_every_call_validates_names(tmp_path):
    store = LocalStore(tmp_path / "s")
    (tmp_path / "secret").write_bytes(b"x")
    for call in (store.get, store.exists, store.delete, store.size, store.local_path):
        with pytest.raises(InvalidNameError):
            call("../secret")
    with pytest.raises(InvalidNameError):
        store.put("../secret", b"y")
    with pytest.raises(InvalidNameError):
        store.list("../")
    assert (tmp_path / "secret").read_bytes() == b"x"


def test_put_get_list_delete(tmp_path):
    store = LocalStore(tmp_path)
    store.put("b/2", b"two")
    store.put("a", b"one")
    store.put("b/1", memoryview(b"uno"))
    assert store.get("a") == b"one" and store.size("b/1") == 3
    assert store.exists("b/2") and not store.exists("b/3") and not store.exists("b")
    assert list(store.list()) == ["a", "b/1", "b/2"]
    assert list(store.list("b/")) == ["b/1", "b/2"]
    assert list(store.list("b/1")) == ["b/1"]
    assert list(store.list("c")) == []
    store.delete("b/1")
    store.delete("b/1")  # deleting a missing object is fine
    assert list(store.list()) == ["a", "b/2"]
    assert store.local_path("a") == tmp_path / "a"


def test_missing_object_error_names_object_and_store(tmp_path):
    store = LocalStore(tmp_path)
    with pytest.raises(ArtifactError, match=r"nope\.json not found in .*check the recording path"):
        store.get("nope.json")
    with pytest.raises(ArtifactError, match="nope"):
        store.size("nope")


def test_put_is_atomic_and_leaves_no_temporary_files(tmp_path):
    store = LocalStore(tmp_path)
    store.put("x", b"a" * 1000)
    seen = []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            seen.append(store.get("x"))

    t = threading.Thread(target=reader)
    t.start()
    for i in range(50):
        store.put("x", bytes([65 + i % 26]) * (1000 + i))
    stop.set()
    t.join()
    assert all(len(set(v)) == 1 and len(v) >= 1000 for v in seen)
    assert os.listdir(tmp_path) == ["x"]


def test_hidden_files_are_not_listed(tmp_path):
    (tmp_path / ".x.tmp").write_bytes(b"")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_bytes(b"")
    assert list(LocalStore(tmp_path).list()) == []


def test_put_file(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 << 20))
    store = LocalStore(tmp_path / "store")
    store.put_file("obj", src)
    assert store.get("obj") == src.read_bytes()
    with pytest.raises(ArtifactError, match="does not exist"):
        store.put_file("obj2", tmp_path / "missing")


def test_open_store_urls(tmp_path):
    assert isinstance(open_store(tmp_path), LocalStore)
    assert open_store(f"file://{tmp_path}").url == str(tmp_path)
    with pytest.raises(ArtifactError, match="unsupported"):
        open_store("ftp://host/x")


def test_open_store_s3_dispatches_to_the_s3_module():
    try:
        import mneme.store.s3  # noqa: F401
    except ImportError:
        with pytest.raises(NotAvailableError, match="S3 backend"):
            open_store("s3://bucket/prefix")


def test_split_recording_url(tmp_path):
    store, name = split_recording_url(str(tmp_path / "123.json"))
    assert store.url == str(tmp_path) and name == "123.json"
    store, name = split_recording_url("456.json")
    assert store.url == os.getcwd() and name == "456.json"
    with pytest.raises(ArtifactError, match="no recording database"):
        split_recording_url(str(tmp_path))
    LocalStore(tmp_path).put("123.json", b"{}")
    LocalStore(tmp_path).put("chunks/12/x", b"")
    store, name = split_recording_url(str(tmp_path) + "/")
    assert name == "123.json"
    LocalStore(tmp_path).put("789.json", b"{}")
    with pytest.raises(ArtifactError, match="2 recording databases"):
        split_recording_url(str(tmp_path))
    with pytest.raises(ArtifactError):
        split_recording_url("s3://123.json")


def test_stray_files_with_invalid_names_are_not_listed(tmp_path):
    (tmp_path / "notes about it.txt").write_bytes(b"")
    (tmp_path / "ok.json").write_bytes(b"")
    assert list(LocalStore(tmp_path).list()) == ["ok.json"]


def _record_one_instance(store, tmp_path):
    """Chunks, snapshots, code and the database of one instance, through the writer (as `mneme record` writes)."""
    import struct

    from mneme.format.database import KernelParam, KernelSignature
    from mneme.format.hashing import static_hash
    from mneme.format.writer import RecordingWriter, RegionSource, new_database
    from mneme.testing.synthetic import vecadd_code

    raw = tmp_path / "region.bin"
    raw.write_bytes(bytes(range(256)) * 16)
    writer = RecordingWriter(store, chunk_size=4096)
    static = static_hash("k", b"code")
    db = new_database(static, KernelSignature("k", "k(int*)", (KernelParam(0, 8, "pointer"),), 8),
                      writer.write_code(static, cubin=vecadd_code.CUBIN))
    region = [RegionSource(0x1000, "heap", "a", path=raw, size=4096)]
    db, _ = writer.write_instance(db, grid=1, block=(32,), shared_mem=0, args=struct.pack("<Q", 0x1000),
                                  pointer_args=[0], prologue=region, epilogue=region)  # fmt: skip
    return db


def test_unsynced_store_makes_everything_durable_before_a_database_is_committed(tmp_path, monkeypatch):
    """sync=False skips per-object fsyncs; the writer's commit puts a durability barrier before the database."""
    import mneme.store.local as local

    events = []
    real_sync = local._sync_file_system
    monkeypatch.setattr(local, "_sync_file_system", lambda d: (events.append(("syncfs", d)), real_sync(d)))
    store = LocalStore(tmp_path / "rec", sync=False)
    real_put = store.put
    monkeypatch.setattr(store, "put", lambda name, data: (events.append(("put", name)), real_put(name, data)))
    db = _record_one_instance(store, tmp_path)
    kinds = [k for k, _ in events]
    assert "syncfs" in kinds
    first_db_put = next(i for i, (k, n) in enumerate(events) if k == "put" and n == db.name)
    assert kinds.index("syncfs") < first_db_put
    assert all(k == "put" for k in kinds[: kinds.index("syncfs")])  # the snapshots and chunks came first


def test_synced_store_needs_no_barrier(tmp_path, monkeypatch):
    import mneme.store.local as local

    monkeypatch.setattr(local, "_sync_file_system", lambda d: pytest.fail("a synced store syncs each object"))
    store = LocalStore(tmp_path, sync=True)
    store.put("a", b"x")
    store.make_durable()


def test_durability_none_fsyncs_nothing_and_still_writes_whole_objects(tmp_path, monkeypatch):
    """`mneme record`'s default: no fsync, no syncfs; every object is still renamed into place whole."""
    import mneme.store.local as local

    monkeypatch.setattr(local, "_sync_file_system", lambda d: pytest.fail("syncfs without --durable"))
    monkeypatch.setattr(local.os, "fsync", lambda fd: pytest.fail("fsync without --durable"))
    store = LocalStore(tmp_path / "rec", durability="none")
    assert not store.sync
    db = _record_one_instance(store, tmp_path)
    assert store.exists(db.name) and not [p for p in (tmp_path / "rec").rglob(".*")]  # no temporary file left


def test_commit_durability_syncs_once_before_the_database_and_then_the_database_itself(tmp_path, monkeypatch):
    """`mneme record --durable`: one syncfs before the database is saved, then an fsync of the database file."""
    import mneme.store.local as local

    events = []
    monkeypatch.setattr(local, "_sync_file_system", lambda d: events.append(("syncfs", None)))
    real_fsync = local.os.fsync
    monkeypatch.setattr(local.os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd)))
    store = LocalStore(tmp_path / "rec", durability="commit")
    real_put = store.put_parts
    monkeypatch.setattr(store, "put_parts", lambda name, parts: (events.append(("put", name)), real_put(name, parts)))
    db = _record_one_instance(store, tmp_path)
    kinds = [k for k, _ in events]
    first_db_put = next(i for i, (k, n) in enumerate(events) if k == "put" and n == db.name)
    assert kinds.count("syncfs") == 1 and kinds.index("syncfs") < first_db_put
    assert all(k == "put" for k in kinds[: kinds.index("syncfs")])  # only whole objects before it, no fsync each
    assert ("fsync", str(tmp_path / "rec" / db.name)) in events[first_db_put:]  # the database file, after its rename
    assert events[-1] == ("fsync", str(tmp_path / "rec"))  # and its directory entry


def test_object_durability_fsyncs_each_object_and_its_directory(tmp_path, monkeypatch):
    import mneme.store.local as local

    synced = []
    real_fsync = local.os.fsync
    monkeypatch.setattr(local.os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    store = LocalStore(tmp_path, durability="object")
    assert store.sync and LocalStore(tmp_path).durability == "object" and LocalStore(tmp_path, sync=False).durability == "commit"
    store.put("a/b", b"x")
    assert len(synced) == 2 and synced[-1] == str(tmp_path / "a")  # the temporary file, then the directory
    with pytest.raises(ValueError, match="durability"):
        LocalStore(tmp_path, durability="sometimes")


def test_put_parts_writes_the_concatenation_atomically(tmp_path):
    store = LocalStore(tmp_path)
    parts = [b"head", memoryview(b"0123456789")[2:5], bytearray(b""), b"x" * 70000]
    store.put_parts("d/e/obj", parts)
    assert store.get("d/e/obj") == b"head234" + b"x" * 70000
    many = [bytes([i % 256]) for i in range(3000)]  # more buffers than one writev call takes
    store.put_parts("many", many)
    assert store.get("many") == b"".join(many)
    store.put("many", b"replaced")
    assert store.get("many") == b"replaced" and sorted(p.name for p in tmp_path.iterdir()) == ["d", "many"]


def test_put_parts_after_the_directory_was_removed(tmp_path):
    import shutil

    store = LocalStore(tmp_path / "s")
    store.put("chunks/ab/one", b"1")
    shutil.rmtree(tmp_path / "s" / "chunks")  # a cleanup between two writes
    store.put("chunks/ab/two", b"2")
    assert store.get("chunks/ab/two") == b"2"


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    import errno

    import mneme.store.local as local

    def full(fd, buffers):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(local.os, "writev", full)
    store = LocalStore(tmp_path)
    with pytest.raises(ArtifactError, match="No space left on device; free some space"):
        store.put("a/b", b"data")
    assert not list((tmp_path / "a").iterdir())


def test_short_writes_are_resumed(tmp_path, monkeypatch):
    import mneme.store.local as local

    real = local.os.writev

    def short(fd, buffers):  # at most 1000 bytes per call, as a signal or a nearly full disk may leave it
        out, left = [], 1000
        for b in buffers:
            view = memoryview(b).cast("B")[:left]
            out.append(view)
            left -= len(view)
            if not left:
                break
        return real(fd, out)

    monkeypatch.setattr(local.os, "writev", short)
    store = LocalStore(tmp_path)
    parts = [b"h" * 10, memoryview(bytes(range(256)) * 20), b"", b"t" * 2500]
    store.put_parts("obj", parts)
    assert store.get("obj") == b"".join(bytes(p) for p in parts)
