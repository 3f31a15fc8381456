"""The store subcommands as users run them: `mneme push/pull/ls/gc/clean/copy/move`, in child processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mneme.store import open_store
from mneme.testing.store_recordings import tree, write_recording

ROOT = Path(__file__).resolve().parents[3]


def mneme(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    result = subprocess.run([sys.executable, "-m", "mneme", *args], capture_output=True, text=True, env=full_env,
                            timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_push_ls_pull_copy_clean_through_the_cli(tmp_path, s3_url, s3_env):
    source = tmp_path / "rec"
    name = write_recording(source, instances=4)
    assert "1 committed" in mneme("push", str(source), s3_url, env=s3_env).stdout
    listing = json.loads(mneme("ls", s3_url, "--json", env=s3_env).stdout)
    assert [r["database"] for r in listing["recordings"]] == [name]
    assert len(listing["recordings"][0]["instances"]) == 4 and listing["dedupe_ratio"] > 1
    per_instance = [i["captured_bytes"] for i in listing["recordings"][0]["instances"]]
    assert min(per_instance) > 0 and sum(per_instance) == listing["recordings"][0]["logical_bytes"]
    text = mneme("ls", s3_url, "-l", env=s3_env).stdout
    assert "solver_step" in text and "dedupe ratio" in text and "grid 128x1x1" in text
    mneme("pull", s3_url, str(tmp_path / "pulled"), env=s3_env)
    assert tree(tmp_path / "pulled") == tree(source)
    mneme("copy", s3_url, f"{s3_url}-copy", name.removesuffix(".json"), env=s3_env)
    assert open_store(f"{s3_url}-copy").exists(name)
    refused = mneme("clean", s3_url, env=s3_env, check=False)
    assert refused.returncode == 2 and "--all" in refused.stderr
    assert "removed 1 recording(s)" in mneme("clean", s3_url, "--all", "--grace", "0", env=s3_env).stdout
    assert list(open_store(s3_url).list()) == []


def test_errors_are_one_line_with_what_to_do(tmp_path, s3_url, s3_env):
    missing = mneme("push", str(tmp_path / "nowhere"), s3_url, env=s3_env, check=False)
    assert missing.returncode == 2 and "no store at" in missing.stderr and "Traceback" not in missing.stderr
    dead = {**s3_env, "MNEME_S3_ENDPOINT": "http://127.0.0.1:9"}
    unreachable = mneme("ls", "s3://bucket/x", "--retries", "2", env=dead, check=False)
    assert unreachable.returncode == 2 and "cannot reach S3" in unreachable.stderr
    assert "Traceback" not in unreachable.stderr
    traversal = mneme("clean", str(tmp_path), "../../etc/passwd", env=s3_env, check=False)
    assert traversal.returncode == 2 and "Traceback" not in traversal.stderr


def test_killed_upload_resumes_without_loss_and_never_shows_a_partial_database(tmp_path, s3_url, s3_env):
    source = tmp_path / "rec"
    name = write_recording(source, instances=2, buffer_bytes=512 << 10, chunk_size=4 << 10, changed_fraction=1.0)
    total_chunks = len(list((source / "chunks").rglob("*")))
    store = open_store(s3_url)
    child = subprocess.Popen(
        [sys.executable, "-m", "mneme", "push", str(source), s3_url, "--workers", "1"],
        env={**os.environ, "PYTHONPATH": str(ROOT), **s3_env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            names = list(store.list())
            assert not any(n.endswith(".json") for n in names), "a database appeared before its chunks"
            if sum(n.startswith("chunks/") for n in names) >= 50:
                break
            assert child.poll() is None, "the push finished before it could be killed; make the recording bigger"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
    uploaded = [n for n in store.list() if n.startswith("chunks/")]
    assert 50 <= len(uploaded) < total_chunks
    assert not store.exists(name), "no database is visible after the kill"

    out = mneme("push", "--resume", str(source), s3_url, env=s3_env).stdout
    present = int(out.split("copied, ")[1].split(" already")[0])
    assert present >= len(uploaded), f"chunks already uploaded were sent again: {out}"
    mneme("pull", s3_url, str(tmp_path / "pulled"), env=s3_env)
    assert tree(tmp_path / "pulled") == tree(source)


def test_every_store_command_prints_its_report_as_json(tmp_path, capsys):
    """push, pull, copy, move, gc, clean and check with --json: one JSON object on standard output (in-process,
    directory stores: the parsing and the reports, not the S3 paths above)."""
    from mneme.cli import main

    def run_json(*args: str, status: int = 0) -> dict:
        assert main([*args, "--json"]) == status
        return json.loads(capsys.readouterr().out)

    source = tmp_path / "rec"
    name = write_recording(source, instances=2)
    pushed = run_json("push", str(source), str(tmp_path / "store"), "--no-progress")
    assert (pushed["recordings"], pushed["committed"], pushed["unchanged"]) == ([name], [name], [])
    assert pushed["chunks_copied"] > 0 and pushed["bytes_copied"] > 0 and pushed["destination"].endswith("store")
    again = run_json("push", str(source), str(tmp_path / "store"), "--no-progress")
    assert again["unchanged"] == [name] and again["chunks_copied"] == again["bytes_copied"] == 0
    pulled = run_json("pull", str(tmp_path / "store"), str(tmp_path / "pulled"), "--no-progress")
    assert pulled["committed"] == [name] and tree(tmp_path / "pulled") == tree(source)
    copied = run_json("copy", str(tmp_path / "store"), str(tmp_path / "copy"), name.removesuffix(".json"))
    assert copied["committed"] == [name]
    checked = run_json("check", str(tmp_path / "copy"), "--read-data")
    assert checked["ok"] is True and checked["damage"] == [] and checked["recordings"] == [name]
    moved = run_json("move", str(tmp_path / "copy"), str(tmp_path / "moved"), "--grace", "0")
    assert moved["transfer"]["committed"] == [name]
    assert moved["clean"]["databases"] == [name] and moved["clean"]["chunks"] > 0 and not moved["clean"]["dry_run"]
    collected = run_json("gc", str(tmp_path / "moved"), "--grace", "0", "--dry-run")
    assert (collected["objects"], collected["chunks"], collected["dry_run"]) == (0, 0, True)
    cleaned = run_json("clean", str(tmp_path / "pulled"), "--all", "--grace", "0")
    assert cleaned["databases"] == [name] and cleaned["bytes"] > 0 and cleaned["dry_run"] is False
    assert not any((tmp_path / "pulled").glob("*.json"))
