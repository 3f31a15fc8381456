"""Helpers of the scale tests (the test-engine servers and the S3 server come from
``replay_server.testing`` and ``mneme.testing``)."""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def wait_until(condition, timeout: float = 20.0, every: float = 0.1):
    """Poll ``condition()`` until it returns something true; that value (or the last false one)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


def free_port_run(count: int) -> int:
    """The first of ``count`` consecutive loopback ports that are free now, below Linux's ephemeral range
    (32768-60999), where no connection of another test takes one between this check and the bind."""
    for _ in range(200):
        base = random.randrange(20000, 32768 - count)
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports found")
