"""Operators' conventions of a replay server: where it listens (checked in /proc/net), the refusal to
listen beyond loopback unprotected, health and reflection without the token (grpcio-reflection's own
client lists the services), process/platform metrics, promtool's lint of the exposition."""

from __future__ import annotations

import shutil
import socket
import subprocess
import urllib.request

import grpc
import pytest

from mneme._internal.network import is_loopback
from mneme.cli import main
from replay_server.protocol import health_pb2, health_pb2_grpc, replay_pb2_grpc
from replay_server.server.serve import ServerOptions, exposure_error
from replay_server.testing.servers import free_port, make_server, request, store  # noqa: F401


def listening(port: int) -> set[str]:
    """The local addresses (``IP``) of listening TCP sockets on ``port``, from /proc/net/tcp and tcp6."""
    found = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state = fields[1], fields[3]
            address, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            text = socket.inet_ntop(family, raw)
            found.add(text.removeprefix("::ffff:"))  # an IPv6 socket bound to a v4-mapped address
    return found


def test_metrics_listen_where_host_says(store, tmp_path):
    metrics_port = free_port()
    server = make_server(store, tmp_path / "log", metrics_port=metrics_port)  # host 127.0.0.1
    grpc_port = server.start()
    try:
        assert listening(metrics_port) == {"127.0.0.1"}, "metrics bound beyond --host"
        assert listening(grpc_port) == {"127.0.0.1"}
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        assert "process_cpu_seconds_total" in text and "python_info{" in text and "mneme_workers_ready" in text
    finally:
        server.stop()


def test_metrics_host_overrides(store, tmp_path):
    metrics_port = free_port()
    server = make_server(store, tmp_path / "log", metrics_port=metrics_port, host="localhost",
                         metrics_host="127.0.0.1")
    server.start()
    try:
        assert listening(metrics_port) == {"127.0.0.1"}
    finally:
        server.stop()


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("localhost", True), ("[::1]", True),
                                            ("127.0.0.2", True), ("[::]", False), ("0.0.0.0", False),
                                            ("10.1.2.3", False), ("node7", False)])
def test_what_counts_as_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_listening_beyond_loopback_needs_a_token_tls_or_insecure():
    assert "--insecure" in exposure_error(ServerOptions(host="[::]"))
    assert "all interfaces" in exposure_error(ServerOptions(host="0.0.0.0"))
    assert exposure_error(ServerOptions(host="[::]", token_file="t")) is None
    assert exposure_error(ServerOptions(host="[::]", tls_cert="c", tls_key="k")) is None
    assert exposure_error(ServerOptions(host="[::]", insecure=True)) is None
    assert exposure_error(ServerOptions(host="127.0.0.1")) is None


def test_the_cli_refuses_an_unprotected_public_listener(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MNEME_FAKE_ENGINE", '{"log_dir": "%s"}' % (tmp_path / "log"))  # (never started)
    port = free_port()
    assert main(["serve", "--gpu", "0", "--port", str(port), "--store", str(tmp_path),
                 "--engine", "replay_server.testing.fake_engine:spec_from_env"]) == 2
    err = capsys.readouterr().err
    assert "without --token-file or --tls-cert" in err and "--insecure" in err and "Traceback" not in err
    assert not listening(port), "nothing was bound"


def test_health_and_reflection_answer_without_the_token(store, tmp_path):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    token = tmp_path / "token"
    token.write_text("s3cret\n")
    server = make_server(store, tmp_path / "log", token_file=str(token))
    port = server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == 1  # SERVING, no token
            services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
            assert {"mneme.v1.ReplayService", "grpc.health.v1.Health",
                    "grpc.reflection.v1alpha.ServerReflection"} <= services
            with pytest.raises(grpc.RpcError) as err:  # the replay service still needs it
                replay_pb2_grpc.ReplayServiceStub(channel).Replay(request(), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop()


def test_reflection_can_be_turned_off(store, tmp_path):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    server = make_server(store, tmp_path / "log", reflection=False)
    port = server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.RpcError) as err:
                ProtoReflectionDescriptorDatabase(channel).get_services()
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        server.stop()


def test_promtool_accepts_the_metrics(store, tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install -y prometheus)")
    metrics_port = free_port()
    server = make_server(store, tmp_path / "log", metrics_port=metrics_port)
    server.start()
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
    finally:
        server.stop()
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    problems = checked.stdout.decode() + checked.stderr.decode()
    # prometheus-client's Info metric is exported as a gauge named *_info, which promtool accepts; any
    # other finding is a naming or help-text mistake of ours.
    assert checked.returncode == 0, problems
