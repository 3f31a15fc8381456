"""Property-based tests: the readers either return a valid object or raise ArtifactError, nothing else."""

import copy
import hashlib
import json
import struct

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mneme.errors import ArtifactError
from mneme.format.chunks import put_chunks, read_chunks
from mneme.format.database import (
    RecordingDatabase,
    content_checksum,
    parse_database_bytes,
)
from mneme.format.snapshot import (
    MAGIC,
    Region,
    Snapshot,
    decode_snapshot,
    encode_snapshot,
)
from mneme.store import LocalStore
from mneme.testing.synthetic import write_vecadd_recording

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)


def frame(body: bytes, version: int = 1) -> bytes:
    return MAGIC + struct.pack("<II", version, len(body)) + body + hashlib.sha256(body).digest()


def sample_snapshot() -> Snapshot:
    sha = "cd" * 32
    return Snapshot(
        "11", "22", "prologue",
        (
            Region(0x1000, 300, "heap", "a", ((sha, 256), (sha, 44))),
            Region(0x2000, 8, "heap", "b", ((sha, 8),), None),
            Region(0x10, 4, "global", "g", ((sha, 4),)),
            Region(0, 16, "parameter", "p", ((sha, 16),)),
        ),
        256,
    )  # fmt: skip


VALID_SNAPSHOT = encode_snapshot(sample_snapshot())


def json_paths(value, prefix=()):
    """Every path (tuple of keys/indices) into a JSON value, the root included."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from json_paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from json_paths(v, prefix + (i,))


def mutate(doc, path, action, replacement):
    """Replace or delete the value at ``path`` (the root can only be replaced)."""
    doc = copy.deepcopy(doc)
    if not path:
        return replacement
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if action == "delete":
        del parent[path[-1]]
    else:
        parent[path[-1]] = replacement
    return doc


def reads_or_artifact_error(read, data):
    try:
        return read(data)
    except ArtifactError:
        return None


@SETTINGS
@given(st.binary(max_size=400))
def test_snapshot_reader_on_random_bytes(data):
    reads_or_artifact_error(lambda d: decode_snapshot(d, "s"), data)


@SETTINGS
@given(st.binary(max_size=400))
def test_snapshot_reader_on_random_bytes_after_magic(data):
    reads_or_artifact_error(lambda d: decode_snapshot(d, "s"), MAGIC + data)


@SETTINGS
@given(st.data())
def test_snapshot_reader_on_corrupted_files(data):
    raw = bytearray(VALID_SNAPSHOT)
    kind = data.draw(st.sampled_from(["flip", "truncate", "insert", "overwrite"]))
    pos = data.draw(st.integers(0, len(raw) - 1))
    if kind == "flip":
        raw[pos] ^= data.draw(st.integers(1, 255))
    elif kind == "truncate":
        del raw[pos:]
    elif kind == "insert":
        raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    else:
        chunk = data.draw(st.binary(min_size=1, max_size=16))
        raw[pos : pos + len(chunk)] = chunk
    assume(bytes(raw) != VALID_SNAPSHOT)
    result = reads_or_artifact_error(lambda d: decode_snapshot(d, "s"), bytes(raw))
    # The checksum covers the header: a changed file never reads as a different snapshot.
    assert result is None or result == sample_snapshot()


@SETTINGS
@given(json_values)
def test_snapshot_header_schema_on_random_json(value):
    try:
        body = json.dumps(value).encode()
    except ValueError:
        return
    reads_or_artifact_error(lambda d: decode_snapshot(d, "s"), frame(body))


@SETTINGS
@given(st.data())
def test_snapshot_header_schema_on_mutated_headers(data):
    header = sample_snapshot().to_header()
    paths = list(json_paths(header))
    path = data.draw(st.sampled_from(paths))
    action = data.draw(st.sampled_from(["replace", "delete"])) if path else "replace"
    mutated = mutate(header, path, action, data.draw(json_values))
    body = json.dumps(mutated, allow_nan=True).encode()
    result = reads_or_artifact_error(lambda d: decode_snapshot(d, "s"), frame(body))
    if result is not None:  # whatever reads must also write back identically
        assert decode_snapshot(encode_snapshot(result), "s") == result


@pytest.fixture(scope="module")
def valid_database(tmp_path_factory):
    rec = write_vecadd_recording(tmp_path_factory.mktemp("rec"), n=64, instances=2)
    return json.loads(rec.store.get(rec.database))


@SETTINGS
@given(st.binary(max_size=400))
def test_database_reader_on_random_bytes(data):
    reads_or_artifact_error(lambda d: parse_database_bytes(d, "x.json"), data)


@SETTINGS
@given(json_values)
def test_database_reader_on_random_json(value):
    reads_or_artifact_error(lambda d: RecordingDatabase.from_dict(d, "x.json"), value)


@SETTINGS
@given(data=st.data())
def test_database_reader_on_mutated_databases(valid_database, data):
    paths = list(json_paths(valid_database))
    path = data.draw(st.sampled_from(paths))
    action = data.draw(st.sampled_from(["replace", "delete"])) if path else "replace"
    mutated = mutate(valid_database, path, action, data.draw(json_values))
    original = RecordingDatabase.from_dict(valid_database)
    # As found on disk: the checksum catches whatever the schema lets through.
    result = reads_or_artifact_error(lambda d: RecordingDatabase.from_dict(d, "x.json"), mutated)
    assert result is None or result == original
    # Resealed (as an intended edit would be): the schema checks alone must hold.
    if isinstance(mutated, dict) and "checksum" in mutated:
        mutated["checksum"] = content_checksum(mutated)
    result = reads_or_artifact_error(lambda d: RecordingDatabase.from_dict(d, "x.json"), mutated)
    if result is not None:
        assert RecordingDatabase.from_dict(result.to_dict()) == result


@SETTINGS
@given(data=st.data())
def test_database_reader_on_corrupted_text(valid_database, data):
    text = bytearray(json.dumps(valid_database, indent=2).encode())
    pos = data.draw(st.integers(0, len(text) - 1))
    text[pos] = data.draw(st.integers(0, 255))
    reads_or_artifact_error(lambda d: parse_database_bytes(d, "x.json"), bytes(text))


region_specs = st.lists(
    st.tuples(st.integers(0, 2**20), st.integers(0, 600), st.sampled_from(["heap", "global", "parameter"])),
    max_size=6,
)


@settings(max_examples=100, deadline=None)
@given(region_specs, st.integers(1, 300))
def test_snapshot_round_trip(specs, chunk_size):
    regions = []
    for i, (base, size, kind) in enumerate(specs):
        chunks = tuple(
            (hashlib.sha256(f"{i}.{j}".encode()).hexdigest(), min(chunk_size, size - off))
            for j, off in enumerate(range(0, size, chunk_size))
        )
        regions.append(Region(base, size, kind, f"r{i}", chunks))
    # Keep address regions disjoint and each kind sorted (the format's invariant).
    regions.sort(key=lambda r: (r.kind, r.base))
    taken, kept = [], []
    for r in regions:
        if r.kind != "parameter" and any(r.base < e and b < r.end for b, e in taken):
            continue
        if r.kind != "parameter":
            taken.append((r.base, r.end))
        kept.append(r)
    snapshot = Snapshot("1", "2", "epilogue", tuple(kept), chunk_size)
    assert decode_snapshot(encode_snapshot(snapshot), "s") == snapshot


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=5000), st.integers(1, 2048))
def test_chunk_round_trip(tmp_path, data, chunk_size):
    store = LocalStore(tmp_path)
    refs = put_chunks(store, data, chunk_size)
    assert sum(r.length for r in refs) == len(data)
    assert read_chunks(store, refs) == data


def read_everything(path):
    """Everything a replay would use from a recording, fully verified."""
    from mneme.recording.execution import RecordedExecution

    rec = RecordedExecution.from_json(path)
    code = {kind: rec.load_code(kind) for kind in rec.code.refs()}
    memory = {}
    for dyn, kernel in rec.items():
        for snapshot in (kernel.load_prologue(), kernel.load_epilogue()):
            for region in snapshot.regions:
                memory[(dyn, snapshot.phase, region.name, region.base)] = region.read(rec.store)
    return rec.database, code, memory


@pytest.fixture(scope="module")
def pristine_recording(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine")
    made = write_vecadd_recording(root, n=700, instances=2, chunk_size=1024)
    return root, made.database, read_everything(made.path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_damaged_recording_reads_identically_or_fails_clearly(pristine_recording, tmp_path_factory, data):
    import shutil

    root, database, expected = pristine_recording
    work = tmp_path_factory.mktemp("damaged") / "rec"
    shutil.copytree(root, work)
    store = LocalStore(work)
    victim = data.draw(st.sampled_from(sorted(store.list())))
    blob = bytearray(store.get(victim))
    action = data.draw(st.sampled_from(["flip", "truncate", "append", "delete", "swap"]))
    if action == "flip" and blob:
        pos = data.draw(st.integers(0, len(blob) - 1))
        blob[pos] ^= data.draw(st.integers(1, 255))
        store.put(victim, bytes(blob))
    elif action == "truncate":
        store.put(victim, bytes(blob[: data.draw(st.integers(0, max(len(blob) - 1, 0)))]))
    elif action == "append":
        store.put(victim, bytes(blob) + data.draw(st.binary(min_size=1, max_size=16)))
    elif action == "delete":
        store.delete(victim)
    else:  # another object's bytes under this name
        other = data.draw(st.sampled_from(sorted(store.list())))
        store.put(victim, store.get(other))
    try:
        got = read_everything(f"{work}/{database}")
    except ArtifactError:
        return
    assert got == expected
