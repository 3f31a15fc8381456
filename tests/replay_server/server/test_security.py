"""Bearer tokens on every replay-service call, TLS and mutual TLS, with certificates made in the test."""

from __future__ import annotations

import datetime
import ipaddress

import grpc
import pytest

from replay_server.protocol import health_pb2, health_pb2_grpc, replay_pb2_grpc
from replay_server.protocol.convert import result_from_proto
from replay_server.testing.servers import make_server, request, store  # noqa: F401

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402


def self_signed(tmp_path, name: str) -> tuple[str, str, bytes, bytes]:
    """(cert path, key path, cert PEM, key PEM) for 'localhost' / 127.0.0.1, its own CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    cert_path, key_path = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert_path.write_bytes(cert_pem)
    key_path.write_bytes(key_pem)
    return str(cert_path), str(key_path), cert_pem, key_pem


def test_every_call_needs_the_bearer_token(store, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    server = make_server(store, tmp_path / "log", token_file=str(token_file))
    port = server.start()
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub, health = replay_pb2_grpc.ReplayServiceStub(channel), health_pb2_grpc.HealthStub(channel)
        for metadata in [(), (("authorization", "Bearer wrong"),), (("authorization", "s3cret-token"),)]:
            with pytest.raises(grpc.RpcError) as err:
                stub.Replay(request(), metadata=metadata, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and "bearer token" in err.value.details()
            with pytest.raises(grpc.RpcError) as err:
                list(stub.ReplayStream(iter([request()]), metadata=metadata, timeout=10))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # health answers without the token (probes); tests/server/test_ops_network.py has reflection
            assert health.Check(health_pb2.HealthCheckRequest(), metadata=metadata, timeout=10).status == 1
        good = (("authorization", "Bearer s3cret-token"),)
        assert result_from_proto(stub.Replay(request(), metadata=good, timeout=10).result).verified
        assert health.Check(health_pb2.HealthCheckRequest(), metadata=good, timeout=10).status == 1
    finally:
        server.stop()


def test_tls_and_mutual_tls(store, tmp_path):
    cert, key, cert_pem, _ = self_signed(tmp_path, "server")
    client_cert, client_key, client_pem, client_key_pem = self_signed(tmp_path, "client")
    server = make_server(store, tmp_path / "log", tls_cert=cert, tls_key=key)
    port = server.start()
    try:
        secure = grpc.secure_channel(f"localhost:{port}", grpc.ssl_channel_credentials(cert_pem))
        reply = replay_pb2_grpc.ReplayServiceStub(secure).Replay(request(), timeout=10)
        assert result_from_proto(reply.result).verified
        plain = replay_pb2_grpc.ReplayServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        with pytest.raises(grpc.RpcError) as err:
            plain.Replay(request(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop()

    mutual = make_server(store, tmp_path / "log2", tls_cert=cert, tls_key=key, tls_client_ca=client_cert)
    port = mutual.start()
    try:
        anonymous = grpc.secure_channel(f"localhost:{port}", grpc.ssl_channel_credentials(cert_pem))
        with pytest.raises(grpc.RpcError) as err:
            replay_pb2_grpc.ReplayServiceStub(anonymous).Replay(request(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        known = grpc.secure_channel(
            f"localhost:{port}", grpc.ssl_channel_credentials(cert_pem, client_key_pem, client_pem))
        assert result_from_proto(replay_pb2_grpc.ReplayServiceStub(known).Replay(request(), timeout=10).result).verified
    finally:
        mutual.stop()


def test_oversized_requests_are_refused(store, tmp_path):
    server = make_server(store, tmp_path / "log", max_message_bytes=1024)
    port = server.start()
    try:
        stub = replay_pb2_grpc.ReplayServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        with pytest.raises(grpc.RpcError) as err:
            stub.Replay(request(passes="x" * 4096), timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        server.stop()
