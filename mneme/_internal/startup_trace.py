"""Start-up trace points: where the time to a first result goes (bench/tune_startup.py reads them).

Off unless ``MNEME_STARTUP_TRACE`` names a file; then every process of a run
(the command, its local servers, their workers and compile processes: they
inherit the variable) appends one JSON line per point::

    {"t": <time.time()>, "pid": 123, "role": "worker", "point": "context"}

A point marks the end of a phase; the benchmark turns the points into the
phases of its table. Writes are single ``os.write`` calls on an ``O_APPEND``
descriptor, so lines of concurrent processes do not interleave. Costs one
environment lookup per point when off.
"""

from __future__ import annotations

import os
import time

ENV = "MNEME_STARTUP_TRACE"


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def mark(role: str, point: str, **facts: object) -> None:
    """Record that ``role`` (cli, tune, executor, server, worker, compile) reached ``point`` now."""
    path = os.environ.get(ENV)
    if not path:
        return
    import json  # only when tracing: `mneme record` starts the application without it

    line = json.dumps({"t": time.time(), "pid": os.getpid(), "role": role, "point": point, **facts}) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:  # tracing never breaks a run
        pass


def read(path: str | os.PathLike[str]) -> list[dict]:
    """The points of a trace file, in time order."""
    import json

    with open(path) as f:
        points = [json.loads(line) for line in f if line.strip()]
    return sorted(points, key=lambda p: p["t"])
