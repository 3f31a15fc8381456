"""``python -m replay_server.probe``: exit 0 when a replay server answers SERVING on grpc.health.v1.

For health checks where no gRPC client is at hand (``docker compose`` health checks) and for servers
behind TLS, which the kubelet's built-in gRPC probe cannot speak (health answers without the bearer
token, so a plaintext server needs neither this nor a token: kubelet's ``grpc`` probe works):

    python -m replay_server.probe --address 127.0.0.1:50051 --token-file /etc/mneme/token/token \\
        [--tls-ca /etc/mneme/tls/ca.crt --tls-server-name mneme-replay]

Exit status: 0 SERVING, 1 NOT_SERVING or unknown, 2 unreachable (with the reason on stderr).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc

from replay_server.protocol import health_pb2, health_pb2_grpc


def check(address: str, token: str | None = None, tls_ca: bytes | None = None, server_name: str | None = None,
          timeout: float = 3.0, service: str = "") -> str:
    """The server's health status name (SERVING, NOT_SERVING, ...); raises grpc.RpcError when unreachable."""
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    if tls_ca is not None:
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(tls_ca), options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = stub.Check(health_pb2.HealthCheckRequest(service=service), metadata=metadata, timeout=timeout)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replay_server.probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default="127.0.0.1:50051", help="HOST:PORT of the server")
    parser.add_argument("--token-file", help="the server's --token-file")
    parser.add_argument("--tls-ca", help="CA bundle to verify the server's TLS certificate (TLS on when given)")
    parser.add_argument("--tls-if-exists", metavar="CA_FILE",
                        help="use TLS with this CA only when the file exists (TLS optional in the deployment)")
    parser.add_argument("--tls-server-name", help="name expected in the server's certificate")
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    ca_path = args.tls_ca or (args.tls_if_exists if args.tls_if_exists and Path(args.tls_if_exists).exists() else None)
    try:
        token = Path(args.token_file).read_text().strip() if args.token_file else None
        ca = Path(ca_path).read_bytes() if ca_path else None
    except OSError as exc:
        print(f"probe: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        status = check(args.address, token, ca, args.tls_server_name, args.timeout)
    except grpc.RpcError as exc:
        print(f"probe: {args.address}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 2
    print(status)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
