"""Jobs (one replay or one prepare) and the queue the workers take them from."""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from mneme.model.experiment import ExperimentConfiguration, ExperimentResult
from replay_server.server.engine import InstanceKey

_ids = itertools.count(1)
LOOKAHEAD = 64  # queued jobs a worker looks through for one whose code is ready


class RequestError(Exception):
    """A request that cannot be served; ``code`` is the gRPC status name (NOT_FOUND, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class JobOutcome:
    """What a job came to: its result (as the worker serialized it, ``result_bytes``: a ``Result``
    message the service sends on as it is; else ``result``), the worker, and its times."""

    result: ExperimentResult | None
    worker: str
    queued_seconds: float
    server_seconds: float
    device_bytes: int = 0
    result_bytes: bytes = b""


@dataclass(eq=False)
class Job:
    """One unit of work for a worker; ``future`` resolves to a JobOutcome or a RequestError."""

    kind: str  # "run" or "prepare"
    instance: InstanceKey
    config: ExperimentConfiguration | None = None
    iterations: int = 3
    warmup: int = 2
    timeout: float = 30.0
    derived_watchdog: bool = False  # no timeout asked for: the pool derives one from the kernel's time (cap: timeout)
    metrics: tuple[str, ...] = ()  # hardware counters to collect after the timed launches (ReplayRequest.metrics)
    watchdog: float = 0.0  # the watchdog its replay ran under (set when it begins)
    compiled: "Future[Any] | None" = None
    future: "Future[JobOutcome]" = field(default_factory=Future)
    id: int = field(default_factory=lambda: next(_ids))
    submitted_at: float = field(default_factory=time.monotonic)
    dispatched_at: float = 0.0
    started: bool = False  # handed to a worker once (its future is RUNNING)
    compile_hit: bool = False  # its code came from the compile cache
    solo: bool = False  # replayed alone: it was in a group whose worker died or hung and which of them did it is
    # unknown, or its verdict needed a replay of its own that was not made with work enqueued behind it
    # Set by callbacks, read without a lock by the workers that look through the queue many times a second:
    code_done: bool = False  # its compile finished (compiled or failed)
    cancelled: bool = False  # its caller cancelled it

    def claim(self) -> bool:
        """Mark as running before the first dispatch; False when the caller cancelled it."""
        if self.started:
            return True
        self.started = True
        return self.future.set_running_or_notify_cancel()


class JobQueue:
    """FIFO shared by the workers of one server; innocent survivors of a crash go first."""

    def __init__(self, on_depth: Callable[[int], None] = lambda n: None) -> None:
        self._items: deque[Job] = deque()
        self._cond = threading.Condition()
        self._on_depth = on_depth
        self._closed = False

    def put(self, job: Job) -> None:
        with self._cond:
            self._items.append(job)
            self._changed()

    def put_front(self, jobs: list[Job]) -> None:
        with self._cond:
            self._items.extendleft(reversed(jobs))
            self._changed()

    def get(self, timeout: float, ready: Callable[[Job], bool] | None = None) -> Job | None:
        """The next job not cancelled by its caller, or None after ``timeout``.

        With ``ready``, the first of the next ``LOOKAHEAD`` jobs that is ready
        (its code compiled) is taken: jobs still compiling stay queued, and a
        worker waits for one to become ready (``wake``) or for a new job
        instead of waiting for one particular compile.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                job = self._take(ready)
                if job is not None:
                    return job
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    return None
                self._cond.wait(remaining)

    def get_many(self, timeout: float, ready: Callable[[Job], bool] | None, limit: int) -> list[Job]:
        """``get``, and with the job it takes up to ``limit - 1`` more of the next ``LOOKAHEAD`` queued jobs
        that are ready and replay the same instance, for one worker message (none with a ``solo`` job, nor
        with hardware counters to collect: those are profiled alone, after their own timed launches).

        Args:
            timeout: seconds to wait for the first job.
            ready: whether a job's code is compiled (None: every job is).
            limit: the most jobs to take.

        Returns:
            The jobs, in queue order (empty after ``timeout``).
        """
        first = self.get(timeout, ready)
        if first is None:
            return []
        jobs = [first]
        if limit <= 1 or first.solo or first.metrics or first.kind != "run":
            return jobs
        with self._cond:
            taken = []
            for i, job in enumerate(itertools.islice(self._items, LOOKAHEAD)):
                if len(jobs) >= limit:
                    break
                if (job.kind == "run" and not job.solo and not job.metrics and not job.cancelled
                        and job.instance == first.instance and (ready is None or ready(job))):
                    jobs.append(job)
                    taken.append(i)
            for i in reversed(taken):
                del self._items[i]
            if taken:
                self._changed()
        return jobs

    def wake(self) -> None:
        """A queued job may have become ready (its compile finished): waiting workers look again."""
        with self._cond:
            self._cond.notify_all()

    def snapshot(self) -> list[Job]:
        with self._cond:
            return list(self._items)

    def _take(self, ready: Callable[[Job], bool] | None) -> Job | None:
        while self._items and self._items[0].cancelled:
            self._items.popleft()
            self._changed()
        if not self._items:
            return None
        if ready is None:
            index: int | None = 0
        else:
            candidates = enumerate(itertools.islice(self._items, LOOKAHEAD))
            index = next((i for i, job in candidates if not job.cancelled and ready(job)), None)
        if index is None:
            return None
        job = self._items[index]
        del self._items[index]
        self._changed()
        return job

    def drain(self) -> list[Job]:
        with self._cond:
            jobs = list(self._items)
            self._items.clear()
            self._changed()
            return jobs

    def discard_cancelled(self) -> int:
        """Drop jobs whose caller went away; returns how many."""
        with self._cond:
            before = len(self._items)
            self._items = deque(j for j in self._items if not j.future.cancelled())
            self._changed()
            return before - len(self._items)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        return len(self._items)

    def _changed(self) -> None:
        self._cond.notify_all()
        self._on_depth(len(self._items))
