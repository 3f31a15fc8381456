"""The CPU compile pool and its content-addressed cache.

Compilation (PTX/IR to cubin) is CPU work: it runs in a process pool beside
the GPU workers, ahead of the replay that needs it, and each product is kept
under a key made of everything that determines it (the recorded code, the
compile-relevant knobs, the GPU arch), so the GPU never waits for a compile
that was done before. A failed compile is not cached: the worker then compiles
itself and reports the compile error in its result.

The pool is made of single compile processes, each fed over its own pipe, so
that work can be sent to a chosen process: ``warm`` has every process read an
instance (load the recording, find the compiler) when it is prepared, so that
the first compile of each process during tuning costs only the compile. Other
work goes to an idle process, or waits in one queue until the first process to
finish takes it: a compile never waits behind a process that is still starting
or warming while another one is free. A call is written to its process by the
thread that asks for it and answered through one reader thread, and nothing
else (no manager or feeder threads) stands between: a compile's latency is
the compile's, even when the server is busy. A process that dies (a compiler
crash, an OOM kill) fails the calls it had and is replaced.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
import weakref
from collections import OrderedDict, deque
from concurrent.futures import CancelledError, Future
from typing import Any

from mneme.mneme_types import ExperimentConfiguration
from replay_server.engine import CompileFunction, InstanceKey
from replay_server.metrics import ServerMetrics


def compile_key(instance: InstanceKey, config: ExperimentConfiguration, arch: str) -> str:
    """Content key of a compile: the instance, the arch and the configuration's ``code_knobs``."""
    canonical = json.dumps(
        {"store": instance.store, "db": instance.record_db, "id": instance.record_id, "arch": arch,
         "knobs": config.code_knobs()},
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


log = logging.getLogger("mneme.serve")


class CompileProcessDied(RuntimeError):
    """The compile process running a call died (compiler crash, OOM kill); it was replaced."""


def _serve_compiles(conn: Any) -> None:
    """A compile process: answer each ``(function, *args)`` call with ``(True, value)`` or ``(False, error)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the server, which stops us
    while True:
        try:
            call = conn.recv()
        except (EOFError, OSError):
            return
        if call is None:
            return
        try:
            answer = (True, call[0](*call[1:]))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
            answer = (False, exc)
        try:
            conn.send(answer)
        except Exception as exc:  # an unpicklable value or error: say what it was
            conn.send((False, RuntimeError(f"the compile's outcome could not be sent back: {answer[1]!r} ({exc})")))


class _CompileProcess:
    """One compile process, its pipe, and the calls it was sent and has not answered (in order)."""

    def __init__(self, mp: Any) -> None:
        self.conn, child = mp.Pipe()
        self.process = mp.Process(target=_serve_compiles, args=(child,), name="mneme-compile", daemon=True)
        self.process.start()
        child.close()
        self.calls: deque[Future] = deque()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass


class CompileCache:
    def __init__(self, function: CompileFunction, processes: int, metrics: ServerMetrics, max_entries: int = 4096):
        self._function = function
        self._metrics = metrics
        self._max_entries = max_entries
        self._mp = multiprocessing.get_context("spawn")
        self._processes = [_CompileProcess(self._mp) for _ in range(max(processes, 1))]
        self._waiting = [0] * len(self._processes)  # submitted and not finished, per process
        self._pending: deque[tuple[Future, tuple]] = deque()  # (future, call) waiting for an idle process
        self._warmed: set[tuple] = set()  # (process index, instance, arch) each process has read
        self._entries: "OrderedDict[str, Future]" = OrderedDict()
        self._lock = threading.RLock()  # a submit can complete at once and re-enter through its callback
        self._closing = False
        self._wake_read, self._wake_write = os.pipe()  # tells the reader that the processes changed
        self._reader = threading.Thread(target=self._read_answers, name="compile-answers", daemon=True)
        self._reader.start()
        # At exit, multiprocessing ends the processes: they are not crashes to replace then.
        this = weakref.ref(self)
        atexit.register(lambda: (pool := this()) is not None and pool.close())
        self.hits = 0
        self.misses = 0

    def _submit(self, index: int | None, *call: Any) -> Future:
        """Run ``call`` in process ``index``, or (None) in the first process that is idle."""
        with self._lock:
            if index is None:
                idle = [i for i, n in enumerate(self._waiting) if n == 0]
                if not idle:
                    work: Future = Future()
                    self._pending.append((work, call))
                    return work
                index = idle[0]
            return self._start(index, call)

    def _start(self, index: int, call: tuple) -> Future:
        """Hand ``call`` to process ``index`` (lock held)."""
        if self._closing:
            raise CancelledError("the compile pool is closing")
        work: Future = Future()
        work.set_running_or_notify_cancel()
        process = self._processes[index]
        self._waiting[index] += 1
        work.add_done_callback(lambda _: self._finished_one(index))
        process.calls.append(work)  # before it is sent: its answer can come at once
        try:
            process.conn.send(call)
        except (OSError, ValueError):  # it died: the reader fails its calls (this one too) and replaces it
            pass
        return work

    def _read_answers(self) -> None:
        """The reader thread: completes each call with its process's answer; replaces processes that die."""
        while True:
            with self._lock:
                processes = [p for p in self._processes if not p.conn.closed]
                if self._closing and not any(p.calls for p in processes):
                    os.close(self._wake_read)
                    return
            handles = [self._wake_read] + [p.conn for p in processes] + [p.process.sentinel for p in processes]
            ready = multiprocessing.connection.wait(handles, timeout=1.0)
            if self._wake_read in ready:
                os.read(self._wake_read, 4096)
            for process in processes:
                try:
                    while process.calls and process.conn.poll():
                        ok, value = process.conn.recv()
                        work = process.calls.popleft()
                        work.set_result(value) if ok else work.set_exception(value)
                except (EOFError, OSError):
                    pass
                if process.process.sentinel in ready or not process.process.is_alive():
                    self._replace(process)

    def _replace(self, process: _CompileProcess) -> None:
        """``process`` died: its calls fail (their compiles are done by the workers), a fresh one takes its
        place (unless the pool is closing)."""
        process.process.join(1)
        with self._lock:
            orphans, process.calls = list(process.calls), deque()
            index = next((i for i, p in enumerate(self._processes) if p is process), None)
            if not self._closing and index is not None:
                log.warning("compile process %d %s; starting another", process.process.pid,
                            f"exited with {process.process.exitcode}")
                self._processes[index] = _CompileProcess(self._mp)
                self._warmed = {w for w in self._warmed if w[0] != index}
        process.conn.close()
        for work in orphans:
            work.set_exception(CompileProcessDied(
                f"the compile process died (exit code {process.process.exitcode}) during this compile"))

    def _finished_one(self, index: int) -> None:
        with self._lock:
            self._waiting[index] -= 1
            while self._pending and self._waiting[index] == 0:
                queued, call = self._pending.popleft()
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
        ident = (instance.store, instance.record_db, instance.record_id, arch)
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

    def request_counted(self, instance: InstanceKey, config: ExperimentConfiguration, arch: str) -> tuple[Future, bool]:
        """``request``, and whether it was a hit (an entry existed, compiled or compiling)."""
        key = compile_key(instance, config, arch)
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                self._metrics.compile_hits.inc()
                return cached, True
            self.misses += 1
            self._metrics.compile_misses.inc()
            product: Future = Future()
            self._entries[key] = product
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
        work = self._submit(None, _timed_compile, self._function, instance, config.to_dict(), arch)
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
        """Compiles not started are cancelled; those running finish; then the processes end."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            pending, self._pending = list(self._pending), deque()
            processes = list(self._processes)
        for queued, _ in pending:
            queued.cancel()
        for process in processes:
            process.stop()
        try:
            os.write(self._wake_write, b"x")
        except OSError:  # the reader is gone already
            pass
        os.close(self._wake_write)
