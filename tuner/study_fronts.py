"""Front processes of ``mneme study-server --fronts N``: gRPC outside the process that holds the study.

A study server's one process spent about as much of its time in gRPC and the event loop as in the
study's operations. With fronts, each front process serves gRPC on the server's port (``SO_REUSEPORT``:
the kernel gives each new connection to one of them) and hands every call, as its method and request
bytes, to the core process over a pipe; the core runs the call as the single-process server does and
sends back the response bytes (or the status the call ended with). The core answers the calls of one
pipe in order, one at a time, so a front matches answers to calls by order.

Wire form over a pipe: a call is ``METHOD`` ``\\n`` ``REQUEST BYTES``; an answer is ``\\x00`` ``RESPONSE BYTES``,
or ``\\x01`` ``STATUS CODE NAME`` ``\\n`` ``DETAILS`` (the call aborted with that status).
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Callable

log = logging.getLogger("mneme.study_server")

OK, ABORTED = b"\x00", b"\x01"


def encode_abort(code_name: str, details: str) -> bytes:
    """The answer of a call that ended with status ``code_name`` (a ``grpc.StatusCode`` name)."""
    return ABORTED + f"{code_name}\n{details}".encode("utf-8", "replace")


def front_main(conn: Any, address: str, index: int) -> None:
    """One front process: serve gRPC on ``address`` (the first front: report the port it bound, the others:
    bind the same port) until the core's end of ``conn`` closes.

    Args:
        conn: this front's end of its pipe to the core.
        address: ``HOST:PORT`` to listen on (port 0: a free one; the first front only).
        index: the front's number (0: the first).
    """
    import asyncio
    import signal

    for signum in (signal.SIGINT, signal.SIGTERM):  # the core stops the fronts (their pipes close), not a signal
        signal.signal(signum, signal.SIG_IGN)
    try:
        asyncio.run(_serve(conn, address, index))
    except (EOFError, OSError, KeyboardInterrupt):
        pass


async def _serve(conn: Any, address: str, index: int) -> None:
    import asyncio

    import grpc

    loop = asyncio.get_running_loop()
    pending: collections.deque[asyncio.Future] = collections.deque()
    closed = asyncio.Event()

    def receive() -> None:  # the core's answers, in the order of the calls
        while True:
            try:
                data = conn.recv_bytes()
            except (EOFError, OSError):
                loop.call_soon_threadsafe(closed.set)
                return
            future = pending.popleft()
            loop.call_soon_threadsafe(_resolve, future, data)

    class Forward(grpc.GenericRpcHandler):
        def service(self, details: Any) -> Any:
            method = details.method.encode()

            async def call(request: bytes, context: Any) -> bytes:
                future = loop.create_future()
                pending.append(future)  # (before the send: the answer may come at once)
                conn.send_bytes(method + b"\n" + request)
                data = await future
                if data[:1] == OK:
                    return data[1:]
                code_name, _, text = data[1:].decode("utf-8", "replace").partition("\n")
                await context.abort(getattr(grpc.StatusCode, code_name, grpc.StatusCode.INTERNAL), text)

            return grpc.unary_unary_rpc_method_handler(call)  # bytes in, bytes out

    server = grpc.aio.server(options=[("grpc.so_reuseport", 1)])
    server.add_generic_rpc_handlers([Forward()])
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if not bound:
        conn.send(("failed", f"cannot listen on {address}"))
        return
    await server.start()
    conn.send(("bound", bound))
    threading.Thread(target=receive, name="core-answers", daemon=True).start()
    try:
        await closed.wait()
    finally:
        await server.stop(1.0)


def _resolve(future: Any, data: bytes) -> None:
    if not future.done():
        future.set_result(data)


class Fronts:
    """The core's side: the front processes and their pipes.

    Args:
        count: front processes.
        address: ``HOST:PORT`` they listen on (port 0: the first front picks one, the rest share it).
        startup_timeout: seconds a front may take to bind.
    """

    def __init__(self, count: int, address: str, startup_timeout: float = 60.0) -> None:
        import multiprocessing

        from mneme.errors import ConfigurationError

        context = multiprocessing.get_context("spawn")  # (no fork of a process with gRPC's threads)
        self.processes: list[Any] = []
        self.conns: list[Any] = []
        self.port = 0
        host = address.rsplit(":", 1)[0]
        try:
            for index in range(count):
                parent, child = context.Pipe()
                where = address if index == 0 else f"{host}:{self.port}"
                process = context.Process(target=front_main, args=(child, where, index), daemon=True,
                                          name=f"study-front-{index}")
                process.start()
                child.close()
                self.processes.append(process)
                self.conns.append(parent)
                if not parent.poll(startup_timeout):
                    raise ConfigurationError(f"mneme study-server: front {index} did not start within "
                                             f"{startup_timeout:.0f} s")
                kind, value = parent.recv()
                if kind != "bound":
                    raise ConfigurationError(f"mneme study-server: {value}: the port is taken or the address is not "
                                             "this machine's; give another --port or --host")
                self.port = value
        except BaseException:
            self.stop()
            raise

    def serve(self, answer: Callable[[bytes, bytes], bytes], stop: threading.Event,
              after: Callable[[], None] | None = None) -> bool:
        """Answer the fronts' calls until ``stop`` is set (or every front is gone).

        Args:
            answer: ``(method, request bytes) -> answer bytes`` (see the module's wire form).
            stop: ends the loop when set (looked at every 0.2 s at least).
            after: called after each batch of calls, before their answers go out (the journal written).

        Returns:
            False when every front went away before ``stop`` was set.
        """
        from multiprocessing.connection import wait

        live = list(self.conns)
        while live and not stop.is_set():
            ready = wait(live, 0.2)
            answers = []
            for conn in ready:
                try:
                    data = conn.recv_bytes()
                except (EOFError, OSError):
                    live.remove(conn)
                    log.warning("a front process of the study server is gone; %d left", len(live))
                    continue
                method, _, request = data.partition(b"\n")
                answers.append((conn, answer(method, request)))
            if answers and after is not None:
                after()
            for conn, data in answers:
                try:
                    conn.send_bytes(data)
                except (BrokenPipeError, OSError):
                    pass
        return bool(live) or stop.is_set()

    def stop(self) -> None:
        """Close the pipes (each front stops on their end) and wait for the fronts."""
        for conn in self.conns:
            conn.close()
        for process in self.processes:
            process.join(3)
            if process.is_alive():
                process.kill()
                process.join(1)
