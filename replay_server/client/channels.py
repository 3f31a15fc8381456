"""The executor's side of the gRPC contract: channels, credentials, the token, and its calls.

Everything here runs on the executor's event loop (``grpc.aio``): a server's channel and stub, the
``GetServerInfo`` call that connects it, ``Prepare``, unary ``Replay`` calls, and the
``ReplayBatchStream`` call its requests travel over (two coroutines, a writer and a reader). What the
calls bring back is posted to the executor as events (``post``); the executor's scheduler
(:mod:`replay_server.client.scheduling`) decides what is sent.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import grpc
import grpc.aio

from mneme.errors import ConfigurationError, MnemeError
from replay_server.client.connection import ConnectionSettings
from replay_server.client.scheduling import ServerState, server_capacity

# Transport-level failures: the server (or the way to it) went away; the work is retried elsewhere.
RETRYABLE = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
})
#: Of those, the ones that take the server out for a back-off.
WENT_AWAY = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN})
#: The largest message the executor takes from a server.
MAX_RECEIVE_BYTES = 4 << 20


class ReplayServerError(MnemeError):
    """A replay server refused a request (unknown recording, bad token, malformed request)."""


@dataclass(eq=False)
class Server(ServerState):
    """One server: the scheduler's state of it, and the executor's channel and calls to it."""

    channel: Any = None
    stub: Any = None
    preparing: Any = None  # the Prepare call made on connecting (a concurrent.futures.Future)
    stream: "ReplayBatchStream | None" = None  # the call its requests go over (transport "stream")
    outbox: list = field(default_factory=list)  # requests of this dispatch round, not handed to the stream yet


class ReplayBatchStream:
    """One ``ReplayBatchStream`` call to a server, on the executor's event loop. The dispatcher hands it
    the requests of a round together (``send``) and they go out as one message, with whatever else is
    waiting by the time the previous write is done; the responses come back as the server has them
    ready, as ``("responses", server, stream, responses)`` events, and the call's end as one
    ``("stream_end", server, stream, code, details)`` event. ``pending`` maps the request ids sent and not
    answered to their tasks. Everything here runs in the loop's thread: a stream is two coroutines, not
    threads."""

    def __init__(self, server: Server, metadata: tuple, hold_responses: float,
                 spawn: Callable[[Any], None], post: Callable[[tuple], None]) -> None:
        self.pending: dict[str, Any] = {}
        self._hold = hold_responses
        self._outbox: list = []
        self._closing = False
        self._wakeup = asyncio.Event()
        self._call = server.stub.ReplayBatchStream(metadata=metadata)
        spawn(self._write())
        spawn(self._read(server, post))

    def send(self, requests: list) -> None:
        self._outbox += requests
        self._wakeup.set()

    def close(self) -> None:
        """No more requests: the server answers those it has, then ends the call."""
        self._closing = True
        self._wakeup.set()

    async def _write(self) -> None:
        from replay_server.protocol import replay_pb2

        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                if self._outbox:  # what came while the last write was under way goes in this message
                    batch, self._outbox = self._outbox, []
                    await self._call.write(replay_pb2.ReplayBatch(requests=batch, hold_responses_seconds=self._hold))
                if self._closing and not self._outbox:
                    await self._call.done_writing()
                    return
        except (grpc.RpcError, asyncio.InvalidStateError, asyncio.CancelledError):
            return  # the call ended: its reader reports how

    async def _read(self, server: Server, post: Callable[[tuple], None]) -> None:
        code, details = grpc.StatusCode.OK, ""
        try:
            while True:
                batch = await self._call.read()
                if batch is grpc.aio.EOF:
                    break
                post(("responses", server, self, batch.responses))
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or exc.code().name
        except asyncio.CancelledError:
            code, details = grpc.StatusCode.CANCELLED, "the executor shut down"
        post(("stream_end", server, self, code, details))


class Channels:
    """The executor's channels to its servers and the calls it makes on them (on its event loop).

    Args:
        connection: the connection settings (TLS files are read here: a ConfigurationError names one
            that cannot be read).
        token: the bearer token every call carries (None: none).
        spawn: starts a coroutine as a task of the event loop.
        post: hands the executor an event.
    """

    def __init__(self, connection: ConnectionSettings, token: str | None, spawn: Callable[[Any], None],
                 post: Callable[[tuple], None]) -> None:
        self.metadata: tuple = (("authorization", f"Bearer {token}"),) if token else ()
        self.transport = connection.transport
        self.hold_responses = connection.hold_seconds
        self._credentials = channel_credentials(connection.tls_ca, connection.tls_cert, connection.tls_key)
        self._options = [("grpc.max_receive_message_length", MAX_RECEIVE_BYTES)]
        if connection.tls_server_name:
            self._options.append(("grpc.ssl_target_name_override", connection.tls_server_name))
        self._spawn = spawn
        self._post = post

    async def connect(self, address: str, prepare: Any) -> Server:
        """A channel to ``address`` and what its ``GetServerInfo`` says (its room), then its ``Prepare`` call
        with the request ``prepare`` (see :meth:`prepare`); a server that does not answer yet is left out
        for a second (the dispatcher tries it again) and not asked to prepare.

        Raises:
            ReplayServerError: the server refused the token.
        """
        from replay_server.protocol import replay_pb2, replay_pb2_grpc

        if self._credentials is not None:
            channel = grpc.aio.secure_channel(address, self._credentials, options=self._options)
        else:
            channel = grpc.aio.insecure_channel(address, options=self._options)
        server = Server(address, channel=channel, stub=replay_pb2_grpc.ReplayServiceStub(channel))
        try:
            info = await server.stub.GetServerInfo(replay_pb2.ServerInfoRequest(), metadata=self.metadata, timeout=10)
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                await channel.close()
                raise ReplayServerError(f"replay server {address} refused us: {exc.details()}") from None
            server.down_until = time.monotonic() + 1.0  # not up yet: the dispatcher tries it again
            return server
        server.capacity = server_capacity(int(info.workers), self.transport)
        self.prepare(server, prepare)
        return server

    def prepare(self, server: Server, request: Any) -> None:
        """Start ``server``'s ``Prepare`` call: ``server.preparing`` is its future, and its end a
        ``("prepared", server, answer or None)`` event."""
        server.preparing = Future()
        self._spawn(self._prepare(server, request))

    async def _prepare(self, server: Server, request: Any) -> None:
        try:
            answer = await server.stub.Prepare(request, metadata=self.metadata)
        except grpc.RpcError as exc:
            server.preparing.set_exception(exc)
            answer = None
        except asyncio.CancelledError:
            server.preparing.cancel()
            return
        else:
            server.preparing.set_result(answer)
        self._post(("prepared", server, answer))

    def replay(self, task: Any, server: Server, request: Any) -> None:
        """One ``Replay`` call (transport ``unary``); its end is a ``("done", task, server, code, details,
        response)`` event."""
        self._spawn(self._replay(task, server, request))

    async def _replay(self, task: Any, server: Server, request: Any) -> None:
        try:
            response = await server.stub.Replay(request, metadata=self.metadata)
        except grpc.RpcError as exc:
            self._post(("done", task, server, exc.code(), exc.details() or exc.code().name, None))
        except asyncio.CancelledError:
            self._post(("done", task, server, grpc.StatusCode.CANCELLED, "the executor shut down", None))
        else:
            self._post(("done", task, server, grpc.StatusCode.OK, "", response))

    def stream(self, server: Server) -> ReplayBatchStream:
        """``server``'s ``ReplayBatchStream`` call, opened when it has none."""
        stream = server.stream
        if stream is None:
            stream = server.stream = ReplayBatchStream(server, self.metadata, self.hold_responses, self._spawn,
                                                       self._post)
        return stream

    @staticmethod
    async def close(servers: list[Server]) -> None:
        """Close the servers' channels (their calls end)."""
        await asyncio.gather(*(server.channel.close() for server in servers), return_exceptions=True)


def read_token(path: str) -> str:
    """The bearer token in the file ``path`` (ConfigurationError when it cannot be read)."""
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigurationError(f"cannot read token file {path}: {exc.strerror}") from exc


def channel_credentials(ca: str | None, cert: str | None, key: str | None) -> grpc.ChannelCredentials | None:
    """TLS credentials from these files, or None for plain channels (ConfigurationError naming a file
    that cannot be read)."""
    if not (ca or cert or key):
        return None

    def read(path: str | None) -> bytes | None:
        if path is None:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise ConfigurationError(f"cannot read {path}: {exc.strerror}") from exc

    return grpc.ssl_channel_credentials(read(ca), read(key), read(cert))
