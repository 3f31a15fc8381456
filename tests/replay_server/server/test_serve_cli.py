"""`mneme serve`: its flags, its refusals (exit 2, no traceback), a clean stop on SIGTERM."""

from __future__ import annotations

import os
import signal

import pytest

from mneme.cli import main
from replay_server.testing.servers import make_server, start_server, store  # noqa: F401


def test_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for flag in ("--gpu", "--port", "--metrics-port", "--store", "--workers", "--tls-cert", "--tls-key",
                 "--tls-client-ca", "--token-file", "--watchdog"):
        assert flag in out


@pytest.mark.parametrize("argv, message", [
    (["--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
    (["--store", "/nonexistent/store"], "is not a directory"),
    (["--workers", "0"], "at least one worker"),
    (["--batch", "0"], "--batch 0: give 1 to 32"),
    (["--batch", "33"], "--batch 33: give 1 to 32"),
    (["--token-file", "/nonexistent/token"], "cannot read --token-file"),
    (["--engine", "nonexistent_module:spec"], "cannot be loaded"),
])
def test_bad_settings_are_clear_errors(argv, message, capsys, tmp_path):
    assert main(["serve", "--gpu", "0", "--port", "0", "--store", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_sigterm_stops_the_server_and_its_workers(store, tmp_path):
    process, address = start_server(store, tmp_path / "log", "--workers", "2")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0


TGKILL = {"x86_64": 234, "aarch64": 131}  # the tgkill system call's number


@pytest.mark.skipif(os.uname().machine not in TGKILL, reason="tgkill's number is known for x86_64 and aarch64 only")
def test_sigterm_handed_to_another_thread_stops_the_server(store, tmp_path):
    """The kernel may hand a process's SIGTERM to any of its threads (gRPC has several); the server still
    stops (its main thread used to wait without a time-out, and was never woken to run the handler)."""
    import ctypes

    process, address = start_server(store, tmp_path / "log", "--workers", "1")
    try:
        threads = sorted(int(t) for t in os.listdir(f"/proc/{process.pid}/task") if int(t) != process.pid)
        assert threads, "the server has threads besides its main one"
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syscall(TGKILL[os.uname().machine], process.pid, threads[-1], signal.SIGTERM) == 0
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_taken_port_is_a_clear_error(store, tmp_path):
    from mneme.errors import ConfigurationError

    first = make_server(store, tmp_path / "log")
    port = first.start()
    try:
        second = make_server(store, tmp_path / "log2", port=port)
        with pytest.raises(ConfigurationError, match="port is taken"):
            second.start()
        second.stop()
    finally:
        first.stop()


def test_the_compile_pool_takes_the_servers_share_of_the_cpus():
    from replay_server.server.serve import default_compile_processes

    assert default_compile_processes(1, cpus=16, servers=1) == 14  # less the worker and the supervisor
    assert default_compile_processes(2, cpus=16, servers=1) == 13
    assert default_compile_processes(1, cpus=16, servers=2) == 6  # two servers (one per GPU) share the host
    assert default_compile_processes(1, cpus=16, servers=8) == 4  # never fewer than min(4, CPUs)
    assert default_compile_processes(1, cpus=2, servers=1) == 2
    assert default_compile_processes(1, cpus=1, servers=1) == 1
