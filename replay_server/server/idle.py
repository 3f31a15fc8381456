"""A server that exits when nobody uses it: ``mneme serve --keep-alive SECONDS``.

A local server left running for the next tuner (``mneme serve --local``,
``mneme tune --keep-servers``) holds a GPU context and device memory; once
no tuner has called it for ``SECONDS`` it stops by itself. What counts as
use: any call of the replay service (a tuner's replays, its stream, Prepare,
GetServerInfo, which a tuner looking for a server to reuse asks first), from
its start to its end; an open stream keeps the server in use however long it
waits. Health checks (load balancers, probes) do not count.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import grpc

log = logging.getLogger("mneme.serve")

SERVICE_PREFIX = "/mneme.v1.ReplayService/"


class Activity:
    """Calls in progress and when the last one started or ended; closed for good once found idle."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._last = time.monotonic()
        self._closed = False

    def begin(self) -> bool:
        """Count a call in; False (not counted) once the server is closing: the call must be refused."""
        with self._lock:
            if self._closed:
                return False
            self._active += 1
            self._last = time.monotonic()
            return True

    def end(self) -> None:
        with self._lock:
            self._active -= 1
            self._last = time.monotonic()

    def idle_for(self) -> float:
        """Seconds since the last call ended; 0 while one is in progress."""
        with self._lock:
            return 0.0 if self._active else time.monotonic() - self._last

    def close_if_idle(self, seconds: float) -> bool:
        """Close for good when no call has been in progress for ``seconds``; decided under the same lock
        that lets calls in, so a call (a tuner's probe for a server to reuse) either counts and keeps the
        server, or comes after and is refused: none is answered by a server about to stop."""
        with self._lock:
            if self._active or time.monotonic() - self._last < seconds:
                return False
            self._closed = True
            return True


class ActivityInterceptor(grpc.ServerInterceptor):
    """Counts every replay-service call in ``activity`` from its start until it ends (any way it ends)."""

    def __init__(self, activity: Activity) -> None:
        self.activity = activity

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(SERVICE_PREFIX):
            return handler
        kind = ("stream_" if handler.request_streaming else "unary_") + \
               ("stream" if handler.response_streaming else "unary")
        return handler._replace(**{kind: self._tracked(getattr(handler, kind))})

    def _tracked(self, behavior):
        activity = self.activity

        def tracked(request_or_iterator, context):
            if not activity.begin():
                context.abort(grpc.StatusCode.UNAVAILABLE,
                              "this replay server is stopping (no call for --keep-alive seconds); start another")
            if not context.add_callback(activity.end):  # it has ended already
                activity.end()
            return behavior(request_or_iterator, context)

        return tracked


def exit_when_idle(activity: Activity, keep_alive: float, stop: Callable[[], bool]) -> threading.Thread:
    """Call ``stop()`` once ``activity`` has been idle for ``keep_alive`` seconds; ``stop`` returns False
    when a call came in meanwhile (the server stays and the clock starts again)."""

    def watch() -> None:
        every = min(1.0, keep_alive / 4)
        while True:
            time.sleep(every)
            if activity.idle_for() >= keep_alive:
                log.info("no call for %g s (--keep-alive): stopping", keep_alive)
                if stop():
                    return

    thread = threading.Thread(target=watch, name="idle-exit", daemon=True)
    thread.start()
    return thread
