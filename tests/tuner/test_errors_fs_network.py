"""Everyday file-system and network errors of `mneme tune`: one line naming the directory or the address,
exit status 2, and nothing started before the check."""

from __future__ import annotations

import errno
import io
import json
import socket
import subprocess
import sys
import time

import pytest

import tuner.results.directory
import tuner.run
from mneme.cli import main
from mneme.model.experiment import ExperimentResult
from tuner.errors import ResultsDirectoryError, ServersUnreachableError
from tuner.options import resolve_options
from tuner.preflight import check_servers, connect_error
from tuner.run import run_tune
from tuner.testing import FakeExecutor


@pytest.fixture
def wired(cli_doubles):
    """The executors the run made (the test doubles: tuner.testing.cli_doubles)."""
    return cli_doubles


def tune_args(results, *extra):
    return ["tune", "-rdb", "rec/159.json", "-rid", "163", "--space-preset", "launch", "--launch-dim", "x",
            "--results-dir", str(results), "--quiet", *extra]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("mneme tune: error:")]
    assert len(lines) == 1, err
    return lines[0]


def failing_open(monkeypatch, under, code, reason, when=lambda path, mode: True) -> dict:
    """``open`` of the results directory's module fails for paths under ``under`` (as a read-only file system
    or a full disk would make it fail; the tests run as root, for whom permissions do not) while the
    returned switch's ``on`` is true."""
    real_open = open
    switch = {"on": True}

    def fake_open(path, mode="r", *args, **kwargs):
        if switch["on"] and str(path).startswith(str(under)) and any(m in mode for m in "wa+") and when(path, mode):
            raise OSError(code, reason, str(path))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(tuner.results.directory, "open", fake_open, raising=False)
    return switch


def test_a_results_dir_below_a_file_is_refused_before_anything_starts(tmp_path, wired, capsys):
    (tmp_path / "plain").write_text("a file")
    assert main(tune_args(tmp_path / "plain" / "run")) == 2
    line = one_line_error(capsys)
    assert line == f"mneme tune: error: cannot write {tmp_path / 'plain' / 'run'}: Not a directory"
    assert wired == []  # no executor, so no server


def test_a_read_only_results_dir_is_refused_for_tune_and_resume(tmp_path, wired, monkeypatch, capsys):
    run = tmp_path / "run"
    read_only = failing_open(monkeypatch, run, errno.EROFS, "Read-only file system")
    assert main(tune_args(run)) == 2
    assert one_line_error(capsys) == f"mneme tune: error: cannot write {run}: Read-only file system"
    assert wired == []
    read_only["on"] = False
    assert main(tune_args(run)) == 0  # a run to resume
    read_only["on"] = True
    assert main(["tune", "--resume", "--results-dir", str(run), "-rdb", "rec/159.json", "-rid", "163"]) == 2
    assert one_line_error(capsys) == f"mneme tune: error: cannot write {run}: Read-only file system"
    assert len(wired) == 1  # only the first run's


def test_a_full_disk_mid_run_is_one_line(tmp_path, wired, monkeypatch, capsys):
    run = tmp_path / "run"
    failing_open(monkeypatch, run, errno.ENOSPC, "No space left on device",
                 when=lambda path, mode: str(path).endswith("trials.jsonl") and "a" in mode)
    assert main(tune_args(run)) == 2
    assert one_line_error(capsys) == (f"mneme tune: error: cannot write {run}: No space left on device; "
                                      "free some space")


def test_a_results_directory_error_names_the_directory(tmp_path):
    directory = tuner.results.directory.ResultsDirectory(tmp_path / "x")
    directory.path.write_text("not a directory")
    with pytest.raises(ResultsDirectoryError, match=f"cannot write {tmp_path / 'x'}: "):
        directory.write_json("config.json", {})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_unreachable_servers_are_named_before_the_baseline(tmp_path, wired, capsys):
    port = closed_port()
    started = time.monotonic()
    assert main(tune_args(tmp_path / "run", "--servers", f"127.0.0.1:{port}")) == 2
    assert time.monotonic() - started < 10
    assert one_line_error(capsys).startswith(
        f"mneme tune: error: cannot reach 127.0.0.1:{port}: connection refused; check that `mneme serve` runs")
    assert wired == [] and not (tmp_path / "run" / "baseline.json").exists()


def test_one_unreachable_server_of_several_is_named_and_the_run_goes_on(tmp_path, wired, capsys):
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        alive = f"127.0.0.1:{listening.getsockname()[1]}"
        dead = f"127.0.0.1:{closed_port()}"
        assert main(tune_args(tmp_path / "run", "--servers", alive, dead)) == 0
    err = capsys.readouterr().err
    assert f"warning: cannot reach {dead}: connection refused" in err and alive not in err
    assert len(wired) == 1


def test_connect_errors_say_what_failed():
    assert connect_error(f"127.0.0.1:{closed_port()}") == "connection refused"
    assert connect_error("no-such-host.invalid:50051").startswith("unknown host")
    assert connect_error("unix:/tmp/sock") is None  # not dialed here
    with pytest.raises(ServersUnreachableError, match="cannot reach 127.0.0.1:.*; cannot reach no-such-host"):
        check_servers([f"127.0.0.1:{closed_port()}", "no-such-host.invalid:1"])


class LostServers(FakeExecutor):
    """The executor gave up on its servers: what AsyncReplayExecutor returns when none answers."""

    def evaluate(self, config):
        return ExperimentResult.failure(
            "internal_error", "replay server lost: 3 attempts failed (10.0.0.1:50051: UNAVAILABLE: failed to "
            "connect to all addresses); check that the servers are running (mneme serve)")


def test_a_baseline_no_server_answered_is_not_called_a_broken_replay(tmp_path, loader):
    options = resolve_options({"record_database": "rec/159.json", "record_id": "163", "space_preset": "launch",
                               "launch_dim": "x", "results_dir": str(tmp_path / "run")})
    with pytest.raises(ServersUnreachableError) as raised:
        run_tune(options, executor_factory=lambda o, d, ahead: LostServers(), instance_loader=loader,
                 out=io.StringIO(), is_tty=False)
    assert "10.0.0.1:50051: UNAVAILABLE" in str(raised.value) and "replay itself is broken" not in str(raised.value)


def test_report_of_an_unwritable_directory_is_one_line(tmp_path, wired, monkeypatch, capsys):
    run = tmp_path / "run"
    assert main(tune_args(run)) in (0, 1)
    (run / "report").write_text("a file where the report directory goes")
    assert main(["tune", "report", str(run)]) == 2
    assert one_line_error(capsys).startswith(f"mneme tune: error: cannot write {run / 'report'}: ")


def test_real_tune_with_test_engine_servers_checks_the_directory_first(tmp_path):
    """A real `mneme tune` process, local servers of the test engine: an unwritable results directory stops
    it before any server started (the test engine logs every worker start)."""
    from mneme._internal.child_process import child_env
    from mneme.testing.synthetic import write_vecadd_recording
    from replay_server.testing.servers import ENGINE_ARGS, subprocess_env

    made = write_vecadd_recording(tmp_path / "rec", n=4096, block=256)
    env = subprocess_env(tmp_path / "log")
    del env["PYTHONPATH"]
    env = child_env({**env, "MNEME_CACHE_DIR": str(tmp_path / "cache")})
    (tmp_path / "plain").write_text("a file")
    command = [sys.executable, "-m", "mneme", "tune", "-rdb", str(tmp_path / "rec" / made.database),
               "--space-preset", "launch", "--launch-dim", "x", "--server-engine", ENGINE_ARGS[1]]
    done = subprocess.run(command + ["--results-dir", str(tmp_path / "plain" / "run")], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"mneme tune: error: cannot write {tmp_path / 'plain' / 'run'}: Not a directory"
    assert not (tmp_path / "log" / "starts").exists() and not list((tmp_path / "log").glob("*.log"))
    done = subprocess.run(command + ["--results-dir", str(tmp_path / "run"), "--quiet"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["trials"] > 0
