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


def test_unsynced_store_makes_everything_durable_before_a_database_is_committed(tmp_path, monkeypatch):
    """sync=False skips per-object fsyncs; the writer's commit puts a durability barrier before the database."""
    import mneme.store.local as local
    from mneme.format.writer import RecordingWriter, new_database

    events = []
    real_sync = local._sync_file_system
    monkeypatch.setattr(local, "_sync_file_system", lambda d: (events.append(("syncfs", d)), real_sync(d)))
    store = LocalStore(tmp_path / "rec", sync=False)
    real_put = store.put
    monkeypatch.setattr(store, "put", lambda name, data: (events.append(("put", name)), real_put(name, data)))

    import struct

    from mneme.format.database import KernelParam, KernelSignature
    from mneme.format.hashing import static_hash
    from mneme.format.writer import RegionSource
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
