"""The CPU compile pool and its content-addressed cache.

Compilation (PTX/IR to cubin) is CPU work: it runs in a process pool beside
the GPU workers, ahead of the replay that needs it, and each product is kept
under a key made of everything that determines it (the recorded code, the
compile-relevant knobs, the GPU arch), so the GPU never waits for a compile
that was done before. A failed compile is not cached: the worker then compiles
itself and reports the compile error in its result.

The pool is made of one-process executors, so that work can be sent to a
chosen process: ``warm`` has every process read an instance (load the
recording, find the compiler) when it is prepared, so that the first compile
of each process during tuning costs only the compile. Other work goes to an
idle process, or waits in one queue until the first process to finish takes
it: a compile never waits behind a process that is still starting or warming
while another one is free. Compiles asked for ahead of any replay (``Prepare``'s
list: ``request_counted(..., ahead=True)``) wait in a queue of their own that
a process takes from only when no replay's compile waits; a replay that needs
one of them before it started moves it to the front.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from mneme.model.experiment import ExperimentConfiguration
from replay_server.server.engine import CompileFunction, InstanceKey
from replay_server.server.metrics import ServerMetrics
from replay_server.server.parent import exit_with_parent


def compile_key(instance: InstanceKey, config: ExperimentConfiguration, arch: str) -> str:
    """Content key of a compile: the instance, the arch and the configuration's ``code_knobs``."""
    canonical = json.dumps(
        {"store": instance.store, "db": instance.record_db, "id": instance.record_id, "arch": arch,
         "knobs": config.code_knobs(), "revision": instance.revision},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _timed_compile(function: CompileFunction, instance: InstanceKey, config: dict, arch: str) -> tuple[Any, float]:
    start = time.perf_counter()
    product = function(instance, config, arch)
    return product, time.perf_counter() - start


def _error_of(done: Future) -> BaseException | None:
    """The exception a finished compile ended with (a cancelled one: the pool was closed), or None."""
    if done.cancelled():
        return CancelledError("the compile was cancelled: the compile pool is closing")
    return done.exception()


def _chain(source: Future, target: Future) -> None:
    """Complete ``target`` (already running) as ``source`` completes."""

    def copy(done: Future) -> None:
        error = _error_of(done)
        if error is not None:
            target.set_exception(error)
        else:
            target.set_result(done.result())

    source.add_done_callback(copy)


class CompileCache:
    def __init__(self, function: CompileFunction, processes: int, metrics: ServerMetrics, max_entries: int = 4096):
        self._function = function
        self._metrics = metrics
        self._max_entries = max_entries
        self._mp = multiprocessing.get_context("spawn")
        self._processes = [self._new_process() for _ in range(max(processes, 1))]
        self._waiting = [0] * len(self._processes)  # submitted and not finished, per process
        self._pending: deque[tuple[Future, tuple]] = deque()  # (future, call) waiting for an idle process
        self._ahead: "OrderedDict[str, tuple[Future, tuple]]" = OrderedDict()  # the same, asked for ahead, by key
        self._warmed: set[tuple] = set()  # (process index, instance, arch) each process has read
        self._entries: "OrderedDict[str, Future]" = OrderedDict()
        self._lock = threading.RLock()  # a submit can complete at once and re-enter through its callback
        self.hits = 0
        self.misses = 0

    def _new_process(self) -> ProcessPoolExecutor:
        # A supervisor killed with SIGKILL leaves no compile process behind.
        return ProcessPoolExecutor(max_workers=1, mp_context=self._mp, initializer=exit_with_parent,
                                   initargs=(os.getpid(),))

    def _submit(self, index: int | None, *call: Any, ahead_key: str | None = None) -> Future:
        """Run ``call`` in process ``index``, or (None) in the first process that is idle; when none is,
        it waits (with ``ahead_key``: in the queue of compiles asked for ahead, under that key)."""
        with self._lock:
            if index is None:
                idle = [i for i, n in enumerate(self._waiting) if n == 0]
                if not idle:
                    work: Future = Future()
                    if ahead_key is None:
                        self._pending.append((work, call))
                    else:
                        self._ahead[ahead_key] = (work, call)
                    return work
                index = idle[0]
            return self._start(index, call)

    def _start(self, index: int, call: tuple) -> Future:
        """Hand ``call`` to process ``index`` (lock held)."""
        self._waiting[index] += 1
        try:
            try:
                work = self._processes[index].submit(*call)
            except BrokenProcessPool:  # the process died (ptxas crash, OOM kill): a fresh one takes its place
                self._processes[index].shutdown(wait=False)
                self._processes[index] = self._new_process()
                self._warmed = {w for w in self._warmed if w[0] != index}
                work = self._processes[index].submit(*call)
        except BaseException:
            self._waiting[index] -= 1
            raise
        work.add_done_callback(lambda _: self._finished_one(index))
        return work

    def _finished_one(self, index: int) -> None:
        with self._lock:
            self._waiting[index] -= 1
            while (self._pending or self._ahead) and self._waiting[index] == 0:
                queued, call = self._pending.popleft() if self._pending else self._ahead.popitem(last=False)[1]
                if not queued.set_running_or_notify_cancel():
                    continue
                try:
                    _chain(self._start(index, call), queued)
                except BaseException as exc:  # the pool is closing: say so to the one waiting
                    queued.set_exception(exc)

    def warm(self, instance: InstanceKey, arch: str) -> list[Future]:
        """Have each compile process that has not read ``instance`` yet read it now.

        It compiles the default configuration (the recorded launch), whose
        product becomes the cache entry of that configuration. Processes that
        read it before (an earlier ``Prepare`` of the same instance) get
        nothing: a second client connecting during a sweep does not put a
        warm-up in front of the sweep's compiles.
        """
        default = ExperimentConfiguration()
        key = compile_key(instance, default, arch)
        ident = (instance.store, instance.record_db, instance.record_id, instance.revision, arch)
        works = []
        with self._lock:
            for i in range(len(self._processes)):
                if (i, *ident) in self._warmed:
                    continue
                works.append(self._start(i, (_timed_compile, self._function, instance, default.to_dict(), arch)))
                self._warmed.add((i, *ident))
            if works and key not in self._entries:
                product: Future = Future()
                self._entries[key] = product
                works[0].add_done_callback(lambda done: self._finish(key, product, done))
        return works

    def request(self, instance: InstanceKey, config: ExperimentConfiguration, arch: str) -> Future:
        """A future of the compiled product (shared by every request with the same key)."""
        return self.request_counted(instance, config, arch)[0]

    def request_counted(self, instance: InstanceKey, config: ExperimentConfiguration, arch: str,
                        ahead: bool = False) -> tuple[Future, bool]:
        """``request``, and whether it was a hit (an entry existed, compiled or compiling). ``ahead``: no
        replay waits for it yet, so it yields to every replay's compile until one asks for it."""
        key = compile_key(instance, config, arch)
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None:
                self._entries.move_to_end(key)
                if not ahead and key in self._ahead:  # a replay needs it now: before every compile asked ahead
                    self._pending.append(self._ahead.pop(key))
                self.hits += 1
                self._metrics.compile_hits.inc()
                return cached, True
            self.misses += 1
            self._metrics.compile_misses.inc()
            product: Future = Future()
            self._entries[key] = product
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
        work = self._submit(None, _timed_compile, self._function, instance, config.to_dict(), arch,
                            ahead_key=key if ahead else None)
        work.add_done_callback(lambda done: self._finish(key, product, done))
        return product, False

    def _finish(self, key: str, product: Future, done: Future) -> None:
        error = _error_of(done)
        if error is not None:
            with self._lock:
                self._entries.pop(key, None)
            product.set_exception(error)
            return
        code, seconds = done.result()
        self._metrics.compile_time.observe(seconds)
        product.set_result(code)

    def __len__(self) -> int:
        return len(self._entries)

    def close(self) -> None:
        with self._lock:
            pending, self._pending = list(self._pending) + list(self._ahead.values()), deque()
            self._ahead.clear()
        for queued, _ in pending:
            queued.cancel()
        for process in self._processes:
            process.shutdown(wait=False, cancel_futures=True)
