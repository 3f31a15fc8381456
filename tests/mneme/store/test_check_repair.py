"""Store integrity: `mneme check` finds damaged objects, `push --repair` replaces them, S3 PUTs carry checksums."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os

import pytest
import zstandard
from test_store_cli import mneme

from mneme.errors import ArtifactError
from mneme.format.database import load_database
from mneme.format.snapshot import read_snapshot
from mneme.store import LocalStore, open_store
from mneme.store.check import check_store
from mneme.store.s3 import parse_s3_url
from mneme.store.transfer import pull, push
from mneme.testing.moto_s3 import ACCESS_KEY, SECRET_KEY
from mneme.testing.store_recordings import tree, write_recording


def raw_client(endpoint: str):
    """A minio client that bypasses mneme (no checksums): to damage objects as bit rot would."""
    from minio import Minio

    return Minio(endpoint.split("://", 1)[1], access_key=ACCESS_KEY, secret_key=SECRET_KEY, secure=False,
                 region="us-east-1")


def first_chunk(store, name: str) -> str:
    db = load_database(store, name)
    instance = next(iter(db.instances.values()))
    return read_snapshot(store, instance.prologue.path).regions[0].chunks[0].name


def flipped(data: bytes) -> bytes:
    out = bytearray(data)
    out[len(out) // 2] ^= 0x01
    return bytes(out)


def flip_s3_object(s3_url: str, endpoint: str, name: str) -> None:
    bucket, prefix = parse_s3_url(s3_url)
    client = raw_client(endpoint)
    key = f"{prefix}/{name}"
    response = client.get_object(bucket, key)
    try:
        data = response.read()
    finally:
        response.close()
        response.release_conn()
    damaged = flipped(data)
    client.put_object(bucket, key, io.BytesIO(damaged), len(damaged))


def test_flipped_byte_in_s3_is_found_by_check_read_data_and_repaired_by_push(tmp_path, s3_url, s3_env):
    source = tmp_path / "rec"
    name = write_recording(source, instances=2)
    mneme("push", str(source), s3_url, env=s3_env)
    victim = first_chunk(open_store(s3_url), name)
    flip_s3_object(s3_url, s3_env["AWS_ENDPOINT_URL"], victim)

    structural = mneme("check", s3_url, env=s3_env)  # the size is unchanged: only reading finds a flipped bit
    assert "no damage" in structural.stdout and "structural" in structural.stdout
    found = mneme("check", "--read-data", s3_url, env=s3_env, check=False)
    assert found.returncode == 1, found.stderr
    assert f"{name}: {victim}: corrupt" in found.stdout
    assert "1 damaged object(s) in 1 recording(s)" in found.stdout
    assert f"mneme push --repair GOOD_COPY {s3_url} {name.removesuffix('.json')}" in found.stdout

    again = mneme("push", str(source), s3_url, env=s3_env).stdout
    assert "1 already there" in again, "a plain push of an unchanged recording reads nothing at the destination"
    repaired = mneme("push", "--repair", str(source), s3_url, env=s3_env).stdout
    assert "repaired 1 damaged object(s)" in repaired, repaired
    assert "chunks 1 copied" in repaired
    clean = mneme("check", "--read-data", s3_url, env=s3_env)
    assert "no damage" in clean.stdout
    mneme("pull", s3_url, str(tmp_path / "pulled"), env=s3_env)  # pull verifies every object it copies
    assert tree(tmp_path / "pulled") == tree(source)


def test_check_reports_every_kind_of_damage_in_a_directory_and_repair_restores_it(tmp_path):
    source, copy = tmp_path / "rec", tmp_path / "copy"
    name = write_recording(source, instances=2)
    other = write_recording(source, kernel="other_kernel", instances=1)  # same data: shares chunks with `name`
    push(source, copy)
    dst = LocalStore(copy)
    db = load_database(dst, name)
    instance = next(iter(db.instances.values()))
    chunk = first_chunk(dst, name)
    missing = read_snapshot(dst, instance.epilogue.path).regions[1].chunks[-1].name
    damage = {
        chunk: flipped(dst.get(chunk)),                                      # bit rot in a shared chunk
        instance.prologue.path: flipped(dst.get(instance.prologue.path)),    # a manifest
        db.code.cubin.path: dst.get(db.code.cubin.path)[:-1],                # a truncated code file
        db.code.ptx.path: flipped(dst.get(db.code.ptx.path)),                # a code file, same size
    }
    for path, data in damage.items():
        (copy / path).write_bytes(data)
    (copy / missing).unlink()

    structural = check_store(copy)
    assert {d.object for d in structural.damage} == {instance.prologue.path, db.code.cubin.path, missing}
    assert structural.recordings == sorted([name, other]) and not structural.ok
    full = check_store(copy, read_data=True, workers=3)
    problems = {d.object: d for d in full.damage}
    assert set(problems) == set(damage) | {missing}
    assert problems[chunk].recordings == sorted([name, other]), "a shared chunk names every recording using it"
    assert problems[chunk].problem.startswith("corrupt")
    assert "bytes, the database says" in problems[db.code.cubin.path].problem
    assert problems[missing].problem == "missing"
    assert "SHA-256" in problems[db.code.ptx.path].problem
    assert full.chunks_checked == len({c for c in LocalStore(source).list("chunks/")})
    assert json.loads(json.dumps(full.to_json()))["ok"] is False
    assert check_store(copy, [other.removesuffix(".json")], read_data=True).damaged_recordings == [other]

    report = push(source, copy, repair=True)
    assert sorted(report.repaired) == sorted(damage), report.summary()  # the missing chunk is copied, not repaired
    assert check_store(copy, read_data=True).ok
    assert tree(copy) == tree(source)


def test_plain_push_replaces_a_chunk_whose_size_is_wrong_and_keeps_one_compressed_differently(tmp_path):
    source, copy = tmp_path / "rec", tmp_path / "copy"
    name = write_recording(source, instances=2)
    push(source, copy)
    dst = LocalStore(copy)
    truncated = first_chunk(dst, name)
    (copy / truncated).write_bytes(dst.get(truncated)[:-5])
    recompressed = next(c for c in dst.list("chunks/") if c != truncated)
    content = zstandard.ZstdDecompressor().decompress(dst.get(recompressed))
    other_frame = zstandard.ZstdCompressor(write_checksum=True, write_content_size=True).compress(content)
    assert len(other_frame) != len(dst.get(recompressed))
    (copy / recompressed).write_bytes(other_frame)  # the same content, compressed otherwise: not damage

    write_recording(source, instances=3)  # a changed recording is transferred: its chunks are looked at
    report = push(source, copy)
    assert report.repaired == [truncated], report.summary()
    assert dst.get(recompressed) == other_frame
    assert check_store(copy, read_data=True).ok


def test_a_corrupt_destination_database_is_reported_and_replaced_by_repair(tmp_path):
    source, copy = tmp_path / "rec", tmp_path / "copy"
    name = write_recording(source, instances=1)
    push(source, copy)
    (copy / name).write_bytes(flipped((copy / name).read_bytes()))
    (problem,) = check_store(copy).damage
    assert problem.object == name and problem.recordings == [name]
    write_recording(source, instances=2)
    with pytest.raises(ArtifactError, match="push --repair"):
        push(source, copy)
    report = push(source, copy, repair=True)
    assert name in report.repaired
    assert check_store(copy, read_data=True).ok and len(load_database(LocalStore(copy), name).instances) == 2


def test_repair_needs_a_good_source(tmp_path):
    source, copy = tmp_path / "rec", tmp_path / "copy"
    name = write_recording(source, instances=1)
    push(source, copy)
    victim = first_chunk(LocalStore(copy), name)
    for root in (source, copy):
        (root / victim).write_bytes(flipped((root / victim).read_bytes()))
    with pytest.raises(ArtifactError, match=f"{victim}.*corrupt"):
        push(source, copy, repair=True)
    os.unlink(source / victim)
    with pytest.raises(ArtifactError, match=f"{victim} is missing from {source}.*damaged"):
        push(source, copy, repair=True)


def test_check_exit_status_and_json(tmp_path, s3_url, s3_env):
    source = tmp_path / "rec"
    name = write_recording(source, instances=1)
    mneme("push", str(source), s3_url, env=s3_env)
    report = json.loads(mneme("check", "--json", "--read-data", s3_url, env=s3_env).stdout)
    assert report["ok"] and report["recordings"] == [name] and report["chunks_checked"] > 0
    open_store(s3_url).delete(first_chunk(open_store(s3_url), name))
    broken = mneme("check", "--json", s3_url, env=s3_env, check=False)
    assert broken.returncode == 1 and json.loads(broken.stdout)["damage"][0]["problem"] == "missing"
    for args, env, expected in [
        (["check", str(tmp_path / "nowhere")], s3_env, "no store at"),
        (["check", s3_url, "123"], s3_env, "no recording 123"),
        (["check", "s3://no-such-bucket/p"], s3_env, "does not exist"),
        (["check", "s3://bucket/p", "--retries", "1"], {**s3_env, "MNEME_S3_ENDPOINT": "http://127.0.0.1:9"},
         "cannot reach S3"),
        (["check", "s3://b/p"], s3_env, "does not name a valid S3 bucket"),
    ]:
        failed = mneme(*args, env=env, check=False)
        assert failed.returncode == 2 and expected in failed.stderr, (args, failed.stderr)
        assert len(failed.stderr.strip().splitlines()) == 1 and "Traceback" not in failed.stderr
    (tmp_path / "empty").mkdir()
    empty = mneme("check", str(tmp_path / "empty"), check=False)
    assert empty.returncode == 2 and "no recording database" in empty.stderr


def test_s3_puts_carry_a_sha256_checksum_the_server_keeps(s3_url, s3_env, tmp_path):
    store = open_store(s3_url)
    body = os.urandom(3 << 20)
    store.put("chunks/ab/blob", body)
    (tmp_path / "f").write_bytes(body[:1000])
    store.put_file("Kernel_1.ptx", tmp_path / "f")
    bucket, prefix = parse_s3_url(s3_url)
    client = raw_client(s3_env["AWS_ENDPOINT_URL"])
    for name, data in (("chunks/ab/blob", body), ("Kernel_1.ptx", body[:1000])):
        stat = client.stat_object(bucket, f"{prefix}/{name}", extra_headers={"x-amz-checksum-mode": "ENABLED"})
        assert stat.metadata.get("x-amz-checksum-sha256") == base64.b64encode(hashlib.sha256(data).digest()).decode()
        assert store.get(name) == data


def test_a_put_whose_checksum_does_not_match_its_body_is_refused_where_the_server_verifies(s3_url, s3_env):
    """AWS S3 and MinIO refuse it (BadDigest / XAmzContentChecksumMismatch); moto stores it (see docs/store.md)."""
    from minio.error import S3Error

    bucket, prefix = parse_s3_url(s3_url)
    wrong = base64.b64encode(hashlib.sha256(b"other bytes").digest()).decode()
    try:
        raw_client(s3_env["AWS_ENDPOINT_URL"]).put_object(
            bucket, f"{prefix}/x", io.BytesIO(b"the body"), 8,
            metadata={"x-amz-sdk-checksum-algorithm": "SHA256", "x-amz-checksum-sha256": wrong})
    except S3Error as exc:
        assert "Digest" in exc.code or "Checksum" in exc.code, exc
        assert not open_store(s3_url).exists("x")
        return
    pytest.skip("this S3 server (moto) stores x-amz-checksum-sha256 as given without verifying the body")


def test_checksum_errors_are_retried_as_damage_in_transit(s3_url):
    from minio.error import S3Error

    from mneme.store.retry import RetryPolicy, with_retries
    from mneme.store.s3 import TransferDamagedError

    store = open_store(s3_url)
    error = S3Error(None, "BadDigest", "The SHA256 you specified did not match the calculated checksum.", "x", "r",
                    "h")
    translated = store._translate(error, "x", "write x")  # the mapping under test
    assert isinstance(translated, TransferDamagedError) and "sent again" in str(translated)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise translated
        return "stored"

    assert with_retries(flaky, RetryPolicy(attempts=2), lambda s: None) == "stored"


def test_missing_or_unwritable_locations_are_one_line_errors(tmp_path, s3_url, s3_env):
    source = tmp_path / "rec"
    write_recording(source, instances=1)
    for command in ("ls", "gc", "check"):
        missing = mneme(command, "/nonexistent", check=False)
        assert missing.returncode == 2, missing
        assert missing.stderr.startswith(f"mneme {command}: error: no store at /nonexistent: No such file")
        assert len(missing.stderr.strip().splitlines()) == 1
    not_a_dir = mneme("ls", str(source / next(p.name for p in source.glob("*.json"))), check=False)
    assert not_a_dir.returncode == 2 and "Not a directory" in not_a_dir.stderr
    mneme("push", str(source), s3_url, env=s3_env)
    blocked = tmp_path / "file"
    blocked.write_text("a file where a directory should be")
    pulled = mneme("pull", s3_url, str(blocked / "out"), env=s3_env, check=False)
    assert pulled.returncode == 2 and pulled.stderr.startswith("mneme pull: error: cannot write ")
    assert "Not a directory" in pulled.stderr and "Traceback" not in pulled.stderr
    if os.geteuid() != 0:  # root writes anywhere
        readonly = tmp_path / "readonly"
        readonly.mkdir()
        readonly.chmod(0o555)
        try:
            denied = mneme("pull", s3_url, str(readonly), env=s3_env, check=False)
            assert denied.returncode == 2 and f"cannot write {readonly}" in denied.stderr
            assert "Permission denied" in denied.stderr and "Traceback" not in denied.stderr
        finally:
            readonly.chmod(0o755)


def test_the_cli_maps_any_os_error_to_one_line(monkeypatch, capsys, tmp_path):
    import mneme.store.summary
    from mneme.cli import main

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", "/data/rec/chunks")

    monkeypatch.setattr(mneme.store.summary, "summarize", refuse)
    assert main(["ls", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "mneme ls: error: cannot access /data/rec/chunks: Permission denied\n"


def test_pull_into_a_fresh_directory_after_repair_is_byte_exact(tmp_path, s3_url):
    """The Python API end to end: check -> repair -> check -> pull."""
    source = tmp_path / "rec"
    name = write_recording(source, instances=3)
    push(source, s3_url)
    store = open_store(s3_url)
    victim = first_chunk(store, name)
    blob = store.get(victim)
    store.put(victim, blob[: len(blob) // 2])  # a truncated chunk: the structural check sees its size
    assert check_store(s3_url).ok, "a chunk's stored size is recorded nowhere: the structural check cannot see this"
    report = check_store(s3_url, read_data=True)
    assert [(d.object, d.recordings) for d in report.damage] == [(victim, [name])]
    assert push(source, s3_url, repair=True).repaired == [victim]
    assert check_store(s3_url, read_data=True).ok
    pull(s3_url, tmp_path / "pulled")
    assert tree(tmp_path / "pulled") == tree(source)


def test_a_recording_deleted_while_the_check_runs_is_not_reported_as_damaged(tmp_path):
    source = tmp_path / "rec"
    name = write_recording(source, instances=1)
    kept = write_recording(source, kernel="kept", instances=1, seed=3)

    class Cleaned(LocalStore):
        """A concurrent `mneme clean` of `name`: its database and files go once the check has read it."""

        def get(self, object_name: str) -> bytes:
            data = super().get(object_name)
            if object_name == name:
                for path in load_database(LocalStore(self.root), name).referenced_objects():
                    (self.root / path.path).unlink()
                (self.root / name).unlink()
            return data

    report = check_store(Cleaned(source), read_data=True)
    assert report.ok and report.changed == [name] and report.recordings == sorted([name, kept])
    assert "changed during the check" in report.summary()
