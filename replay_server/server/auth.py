"""Bearer-token check on every call (a gRPC server interceptor).

Clients send ``authorization: Bearer <token>`` metadata; anything else is
answered UNAUTHENTICATED before a handler runs. The comparison is constant-time.
The standard health and reflection services (``OPEN_SERVICES``) answer without
the token, so that kubelet's gRPC probe, ``grpc_health_probe`` and ``grpcurl``
work as they do with any gRPC server; they tell whether the server is up and
what its services are, nothing of its recordings or results.
"""

from __future__ import annotations

import hmac
from pathlib import Path

import grpc

from mneme.errors import ConfigurationError


def read_token_file(path: str) -> str:
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigurationError(f"cannot read --token-file {path}: {exc.strerror}") from exc
    if not token:
        raise ConfigurationError(f"--token-file {path} is empty; put the bearer token on its first line")
    return token


def _rejecting_handler(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    def reject(request_or_iterator, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(reject, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(reject, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(reject, **kwargs)
    return grpc.unary_unary_rpc_method_handler(reject, **kwargs)


#: Services any caller may use without the token (method paths start with ``/SERVICE/``).
OPEN_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                 "grpc.reflection.v1.ServerReflection")
_OPEN_PREFIXES = tuple(f"/{name}/" for name in OPEN_SERVICES)


class BearerTokenInterceptor(grpc.ServerInterceptor):
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method.startswith(_OPEN_PREFIXES):
            return continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        presented = metadata.get("authorization", "")
        if isinstance(presented, str):
            presented = presented.encode()
        handler = continuation(handler_call_details)
        if handler is None or hmac.compare_digest(presented, self._expected):
            return handler
        reason = "missing" if not presented else "wrong"
        return _rejecting_handler(
            handler,
            f"{reason} bearer token: send metadata 'authorization: Bearer <token>' with the server's --token-file token",
        )
