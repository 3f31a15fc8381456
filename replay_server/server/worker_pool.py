"""Worker processes of one server, each watched by its own control thread.

A control thread starts its worker (spawn), waits for the self-test, feeds it
jobs from the shared queue (up to ``depth`` messages at a time, so the GPU
never waits for the pipe; a message carries up to ``batch`` ready jobs of one
instance, which the worker replays in one engine call), enforces the
per-replay watchdog, and replaces the worker when it dies or hangs: the job it
was running fails with the reason (the guilty one), the jobs queued behind it
go back to the front of the queue (the innocent). When the worker was running
several jobs at once, which one is guilty is not known: they all go back, each
to be replayed alone (``Job.solo``), so the guilty one is found by itself. A slot that cannot start a healthy worker ``max_start_failures``
times in a row gives up; when every slot has, the server is NOT_SERVING.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing
import multiprocessing.connection
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from mneme.model.experiment import (
    STATUS_RUNTIME_ERROR,
    STATUS_TIMEOUT,
    ExperimentResult,
)
from mneme.model.verification import ResetDecision
from replay_server.server.jobs import Job, JobOutcome, JobQueue, RequestError
from replay_server.server.metrics import ServerMetrics
from replay_server.server.worker import pack_config, worker_main

log = logging.getLogger("mneme.serve")

# Exceptions a worker reports when preparing an instance, and the gRPC code each means.
_ERROR_CODES = {
    "KeyError": "NOT_FOUND",
    "LookupError": "NOT_FOUND",
    "FileNotFoundError": "NOT_FOUND",
    "ArtifactError": "FAILED_PRECONDITION",
    "ConfigurationError": "INVALID_ARGUMENT",
    "NotAvailableError": "FAILED_PRECONDITION",
    "RelocationRefusedError": "FAILED_PRECONDITION",
    "UnsupportedInstanceError": "FAILED_PRECONDITION",
}


#: ``Result.compile_cached = true`` as serialized bytes (field 19, varint 1). Appended to a serialized
#: ``Result``, it sets the field: protobuf keeps the last value of a field that occurs twice.
COMPILE_CACHED_FIELD = b"\x98\x01\x01"

#: A replay's default watchdog, once the kernel's time is known: this many times the kernel's time for each
#: launch, plus the slack (a compile in the worker, resets, comparisons), at least the minimum.
WATCHDOG_FACTOR = 20
WATCHDOG_SLACK_S = 2.0
MIN_WATCHDOG_S = 5.0


@dataclass
class PoolSettings:
    gpu: int
    workers: int = 1
    depth: int = 2  # messages handed to a worker at once (pipelining)
    batch: int = 8  # jobs of one instance a message carries at most (one engine call)
    startup_timeout: float = 120.0  # spawn + self-test
    prepare_timeout: float = 600.0  # load + restore one instance
    max_start_failures: int = 3
    prepared_cache_bytes: int = 0  # per worker; 0: half the device memory, shared by the workers


class WorkerSlot:
    """One worker process and the thread that watches it."""

    def __init__(self, pool: "WorkerPool", index: int) -> None:
        self.pool = pool
        self.name = f"gpu{pool.settings.gpu}/w{index}"
        self.process: Any = None
        self.conn: Any = None
        self.ready = False
        self.gave_up = False
        self.retiring = False  # the worker said its context is lost: it takes no more jobs
        self.info: dict = {}
        self.held_bytes = 0
        self.start_failures = 0
        self.last_start_error = ""
        self.inflight: collections.deque[list[Job]] = collections.deque()  # the messages sent, their jobs
        self.directed: collections.deque[Job] = collections.deque()  # jobs for this worker only (prepare)
        self._deadline = 0.0
        self._deadline_is_watchdog = False
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name=f"control-{self.name}", daemon=True)

    # -- lifecycle -------------------------------------------------------------
    def _loop(self) -> None:
        while not self.pool.stopping:
            if self.process is None:
                if self._start():
                    continue
                if self.start_failures >= self.pool.settings.max_start_failures:
                    self.gave_up = True
                    with self._lock:
                        orphans, self.directed = list(self.directed), collections.deque()
                    for job in orphans:
                        self.pool.fail(job, self.pool.unavailable())
                    log.error("%s: giving up after %d failed starts: %s", self.name, self.start_failures,
                              self.last_start_error)
                    self.pool.slot_changed()
                    return
                time.sleep(min(0.2 * self.start_failures, 2.0))
                continue
            if self.retiring or not self.process.is_alive():
                self._drain_messages()
                self._on_worker_died()
                continue
            self._fill()
            if self.inflight:
                self._watch()
        self._stop_process()

    def _start(self) -> bool:
        settings = self.pool.settings
        parent, child = multiprocessing.Pipe()
        process = self.pool.mp.Process(
            target=worker_main,
            args=(self.pool.spec, settings.gpu, child, settings.prepared_cache_bytes, settings.workers),
            name=f"mneme-worker-{self.name}",
            daemon=True,
        )
        process.start()
        child.close()
        reason = ""
        deadline = time.monotonic() + settings.startup_timeout
        ready: list = []
        while not ready and not self.pool.stopping and time.monotonic() < deadline:
            ready = multiprocessing.connection.wait([parent, process.sentinel], 0.1)
        message = None
        if parent in ready:
            try:
                message = parent.recv()
            except (EOFError, OSError):
                message = None
        if message and message[0] == "ready":
            self.process, self.conn, self.info = process, parent, message[1] or {}
            self.ready, self.start_failures, self.held_bytes = True, 0, 0
            log.info("%s: worker %d ready (%s)", self.name, process.pid, self.info)
            self.pool.slot_changed(info=self.info)
            return True
        if message is None and not ready and self.pool.stopping:  # not a failure: the server is stopping
            _kill(process)
            parent.close()
            log.info("%s: worker %d stopped during its start-up (the server stops)", self.name, process.pid)
            return False
        if message and message[0] == "failed":
            reason = message[1]
        elif not ready:
            reason = f"no self-test result within {settings.startup_timeout:.0f}s"
        else:
            process.join(1)
            reason = f"worker exited during start-up ({describe_exit(process.exitcode)})"
        _kill(process)
        parent.close()
        self.start_failures += 1
        self.last_start_error = reason
        log.warning("%s: worker start failed (%d in a row): %s", self.name, self.start_failures, reason)
        return False

    def _stop_process(self) -> None:
        if self.process is None:
            return
        try:
            self.conn.send(("stop",))
        except (OSError, ValueError):
            pass
        self.process.join(2)
        _kill(self.process)
        self._discard_process()

    def _discard_process(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.process, self.conn, self.ready, self.held_bytes, self.retiring = None, None, False, 0, False
        self.pool.slot_changed()

    # -- feeding ---------------------------------------------------------------
    def _next_jobs(self) -> list[Job]:
        """This worker's own jobs first (one), then the first queued job whose code is ready and more of
        the same instance that are (they go ahead of those still compiling, which stay queued). With a
        replay in flight it does not wait (the running job's watchdog is watched meanwhile); an idle
        worker waits a little for a job to become ready."""
        with self._lock:
            if self.directed:
                return [self.directed.popleft()]
        return self.pool.queue.get_many(0.0 if self.inflight else 0.1, self._code_ready, self.pool.settings.batch)

    def _fill(self) -> None:
        while len(self.inflight) < self.pool.settings.depth and not self.pool.stopping and not self.retiring:
            jobs = self._next_jobs()
            if not jobs:
                return
            if self.inflight and (jobs[0].solo or any(job.solo for sent in self.inflight for job in sent)):
                # A suspect runs alone: nothing enqueued behind it or before it (a later kernel that hangs
                # or faults would be charged to it).
                self._give_back(jobs)
                return
            jobs = [job for job in jobs if job.claim()]  # not those cancelled by their caller (counted then)
            if not jobs:
                continue
            try:
                self._send(jobs)
            except (OSError, ValueError):  # the worker is gone; the loop notices and replaces it
                self._give_back(jobs)
                return
            self.inflight.append(jobs)
            self.pool.in_flight_changed(+len(jobs))
            if len(self.inflight) == 1:
                self._arm_prepare_deadline()

    def _code_ready(self, job: Job) -> bool:
        """Its compile is done (or failed: the worker then compiles and reports), or none was requested
        (no compile pool; the arch was unknown at submission: ``_send`` requests it and waits), or it has
        been compiling longer than a prepare may take (``_send`` gives up on it, the worker compiles)."""
        return (job.compiled is None or job.code_done
                or time.monotonic() - job.submitted_at > self.pool.settings.prepare_timeout)

    def _give_back(self, jobs: list[Job]) -> None:
        if jobs and jobs[0].kind == "prepare":
            with self._lock:
                self.directed.extendleft(reversed(jobs))
        elif jobs:
            self.pool.queue.put_front(jobs)

    def _send(self, jobs: list[Job]) -> None:
        now = time.monotonic()
        for job in jobs:
            job.dispatched_at = now
        first = jobs[0]
        decision = self.pool.reset_decisions.get(first.instance)
        if first.kind == "prepare":
            self.conn.send(("prepare", first.id, first.instance, decision))
            return
        runs = []
        for job in jobs:
            compiled = None
            self.pool.request_compile(job, self.info.get("arch", ""))  # when the arch was unknown at submission
            if job.compiled is not None:
                try:
                    compiled = job.compiled.result(timeout=self.pool.settings.prepare_timeout)
                except Exception:  # a compile error: the worker compiles and reports it in the result
                    compiled = None
            runs.append((job.id, pack_config(job.config), job.iterations, job.warmup, compiled, job.metrics))
        self.conn.send(("runs", first.instance, decision, runs))

    def _arm_prepare_deadline(self) -> None:
        self._deadline = time.monotonic() + self.pool.settings.prepare_timeout
        self._deadline_is_watchdog = False

    # -- watching --------------------------------------------------------------
    def _watch(self) -> None:
        timeout = max(0.0, min(self._deadline - time.monotonic(), 0.05))
        ready = multiprocessing.connection.wait([self.conn, self.process.sentinel], timeout)
        if self.conn in ready or self.process.sentinel in ready:
            self._drain_messages()
            if self.process is not None and (self.retiring or not self.process.is_alive()):
                self._on_worker_died()
            return
        if time.monotonic() >= self._deadline:
            self._on_deadline()

    def _drain_messages(self) -> None:
        try:
            while self.conn.poll():
                self._handle(self.conn.recv())
        except (EOFError, OSError):
            self.process.join(1)

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        head = self.inflight[0] if self.inflight else None
        if kind == "results":  # (answers for some of the head's jobs: the others are given back)
            answered = {answer[0] for answer in message[1]}
            fits = head is not None and answered <= {job.id for job in head}
            job_id = head[0].id if fits else (message[1][0][0] if message[1] else None)
        else:
            job_id = message[1]
        if head is None or head[0].id != job_id:
            log.error("%s: unexpected %s for job %s; replacing the worker", self.name, kind, job_id)
            _kill(self.process)
            return
        if kind == "begin":
            watchdog = self.pool.batch_watchdog(head)
            for job in head:
                job.watchdog = watchdog
            self._deadline = time.monotonic() + watchdog
            self._deadline_is_watchdog = True
            return
        self.inflight.popleft()
        self.pool.in_flight_changed(-len(head))
        if self.inflight:
            self._arm_prepare_deadline()
        first = head[0]
        if kind == "results":
            answers = {answer[0]: answer for answer in message[1]}
            self.held_bytes, self.retiring = message[2], message[3]
            self.pool.learn(first.instance, message[4])
            done = [(job, answers[job.id]) for job in head if job.id in answers]
            self.pool.complete_answers(done, self.name)
            unanswered = [job for job in head if job.id not in answers]
            if not self.retiring:
                # Its verdict needed a replay of its own, which the worker did not make with another group
                # enqueued behind it on the GPU (a kernel there that hangs would hold it): replayed alone.
                for job in unanswered:
                    job.solo = True
            self._give_back(unanswered)  # after a lost context: innocent
        elif kind == "lost":  # a shared engine call lost the context: which job did it is unknown
            log.warning("%s: the context was lost in a replay of %d configurations; each is replayed alone",
                        self.name, len(head))
            self.retiring = True
            self._requeue_alone(head)
        elif kind == "redo":  # the proof lost the context: a fresh worker does the jobs with resets every launch
            self.pool.decide(first.instance, message[2])
            self.held_bytes, self.retiring = message[3], True
            self.inflight.appendleft(head)  # innocent: given back when the worker is replaced
            self.pool.in_flight_changed(+len(head))
        elif kind == "prepared":
            self.held_bytes, problem, self.retiring = message[3], message[4], message[5]
            self.pool.learn(first.instance, message[6])
            if problem:
                self.pool.fail(first, RequestError(
                    "FAILED_PRECONDITION",
                    f"{self.name} restored the instance but cannot replay it: {problem}"
                    + ("; the worker was replaced" if self.retiring else ""),
                ))
            else:
                self.pool.complete_prepare(first, message[2], self.name)
        elif kind == "error":
            code = _ERROR_CODES.get(message[2], "INTERNAL")
            for job in head:
                self.pool.fail(job, RequestError(code, message[3]))
        self.pool.slot_changed()

    def _requeue_alone(self, jobs: list[Job]) -> None:
        """Jobs of a message whose worker died or hung, with no way to tell which of them did it: back to
        the front of the queue, each to be replayed alone (the guilty one then fails by itself)."""
        for job in jobs:
            job.solo = True
        self._give_back(jobs)

    def _on_worker_died(self) -> None:
        if self.retiring:  # it answered its last job and said so: the rest are innocent
            self.process.join(5)
        exitcode = self.process.exitcode
        reason = describe_exit(exitcode)
        log.warning("%s: worker %d %s (%s)", self.name, self.process.pid,
                    "retired after a context-destroying fault" if self.retiring else "died", reason)
        if self.inflight and not self.retiring:
            head = self.inflight.popleft()
            self.pool.in_flight_changed(-len(head))
            if len(head) > 1 or self.inflight:  # shared, or others enqueued behind it: the culprit is unknown
                for sent in self.inflight:
                    for job in sent:
                        job.solo = True
                self._requeue_alone(head)
                self._replace()
                return
            guilty = head[0]
            self.pool.fail_guilty(
                guilty, STATUS_RUNTIME_ERROR,
                f"the replay worker died ({reason}) while running this configuration: the kernel probably "
                "faulted (illegal address, trap) and took the CUDA context with it; the worker was replaced",
                self.name,
            )
        self._replace()

    def _on_deadline(self) -> None:
        head = self.inflight.popleft()
        self.pool.in_flight_changed(-len(head))
        _kill(self.process)
        guilty = head[0]
        if self._deadline_is_watchdog and (len(head) > 1 or self.inflight):
            # Several configurations shared the engine call, or others were enqueued behind it on the GPU
            # (a kernel that hangs there also holds up this one's results): which one hangs is unknown.
            log.warning("%s: watchdog: %d configuration(s) ran past %.3gs with %d more enqueued behind them; "
                        "killing the worker, each is replayed alone", self.name, len(head), guilty.watchdog,
                        sum(len(sent) for sent in self.inflight))
            for sent in self.inflight:
                for job in sent:
                    job.solo = True
            self._requeue_alone(head)
        elif self._deadline_is_watchdog:
            watchdog = guilty.watchdog or guilty.timeout
            log.warning("%s: watchdog: job %d ran past %.3gs; killing the worker", self.name, guilty.id, watchdog)
            derived = (f" ({WATCHDOG_FACTOR}x the kernel's {self.pool.kernel_ns.get(guilty.instance, 0) / 1e3:.4g} us x "
                       f"{guilty.iterations + guilty.warmup} launches + {WATCHDOG_SLACK_S:g}s)"
                       if watchdog < guilty.timeout else "")
            self.pool.fail_guilty(
                guilty, STATUS_TIMEOUT,
                f"no result within {watchdog:.3g}s (watchdog{derived}): the kernel probably hangs with this "
                "configuration; the worker was killed and replaced (the request's timeout_seconds sets the "
                "watchdog for longer kernels)",
                self.name,
            )
        else:
            self.pool.fail(guilty, RequestError(
                "DEADLINE_EXCEEDED",
                f"preparing {guilty.instance.record_db}:{guilty.instance.record_id} took longer than "
                f"{self.pool.settings.prepare_timeout:g}s; check the store's speed and the recording's size",
            ))
        self._replace()

    def _replace(self) -> None:
        _kill(self.process)  # a retiring worker that does not manage to exit is ended too
        innocent = list(self.inflight)
        self.inflight.clear()
        self.pool.in_flight_changed(-sum(len(jobs) for jobs in innocent))
        for jobs in reversed(innocent):  # back in front of everything else, in their order
            self._give_back(jobs)
        self.pool.metrics.worker_restarts.inc()
        self.pool.restarts += 1
        self._discard_process()


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def _kill(process: Any) -> None:
    if process.is_alive():
        process.kill()
    process.join(5)


class WorkerPool:
    """The queue and the worker slots of one server."""

    def __init__(
        self,
        spec: Any,
        settings: PoolSettings,
        metrics: ServerMetrics,
        on_health: Callable[[bool], None] = lambda serving: None,
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.metrics = metrics
        self.mp = multiprocessing.get_context("spawn")
        self.queue = JobQueue(on_depth=metrics.queue_depth.set)
        self.stopping = False
        self.restarts = 0
        self.completed = 0
        self.in_flight = 0
        self.arch = ""
        self.device: dict = {}  # what the last worker's self-test reported (name, arch, total_memory)
        self._on_health = on_health
        self.compile_cache: Any = None  # replay_server.server.compile_cache.CompileCache, set by the server
        self._lock = threading.Lock()
        self._compile_lock = threading.Lock()
        # What workers learnt of an instance, for the workers that replay it next: the reset policy an earlier
        # worker's proof decided when it lost its context (a kernel that is not idempotent), and the kernel's
        # time (the replay watchdog's base).
        self.reset_decisions: dict[Any, ResetDecision] = {}
        self.kernel_ns: dict[Any, int] = {}
        self.slots = [WorkerSlot(self, i) for i in range(settings.workers)]

    def start(self) -> None:
        for slot in self.slots:
            slot.thread.start()

    def replay_watchdog(self, job: Job) -> float:
        """The watchdog of ``job``'s replay: the one asked for; else, once the kernel's time is known,
        ``WATCHDOG_FACTOR`` x its time x the launches + ``WATCHDOG_SLACK_S``, at least ``MIN_WATCHDOG_S``
        and at most the server's ``--watchdog`` (a configuration that hangs costs seconds, not the whole
        watchdog); the server's ``--watchdog`` while the kernel's time is not known."""
        kernel_ns = self.kernel_ns.get(job.instance)
        if not job.derived_watchdog or not kernel_ns or job.kind != "run" or job.metrics:
            return job.timeout  # (hardware counters: passes of resets and launches the kernel's time does not bound)
        launches = job.iterations + job.warmup
        derived = WATCHDOG_FACTOR * kernel_ns * launches / 1e9 + WATCHDOG_SLACK_S
        return min(job.timeout, max(MIN_WATCHDOG_S, derived))

    def batch_watchdog(self, jobs: list[Job]) -> float:
        """The watchdog of a worker message: its job's (:meth:`replay_watchdog`); for several jobs replayed
        together, once the kernel's time is known, ``WATCHDOG_FACTOR`` x its time x all their launches +
        ``WATCHDOG_SLACK_S`` (within ``MIN_WATCHDOG_S`` and the longest of their timeouts), else the
        longest of their timeouts."""
        if len(jobs) == 1:
            return self.replay_watchdog(jobs[0])
        first = jobs[0]
        longest = max(job.timeout for job in jobs)
        kernel_ns = self.kernel_ns.get(first.instance)
        if not kernel_ns or not all(job.derived_watchdog for job in jobs):
            return longest
        launches = sum(job.iterations + job.warmup for job in jobs)
        return min(longest, max(MIN_WATCHDOG_S, WATCHDOG_FACTOR * kernel_ns * launches / 1e9 + WATCHDOG_SLACK_S))

    def learn(self, instance: Any, kernel_ns: int | None) -> None:
        """A worker measured (or read) ``instance``'s kernel time: the longest seen is kept."""
        if kernel_ns and kernel_ns > self.kernel_ns.get(instance, 0):
            self.kernel_ns[instance] = int(kernel_ns)

    def decide(self, instance: Any, decision: ResetDecision) -> None:
        """An earlier worker's proof lost its context: every worker replays ``instance`` with ``decision``."""
        if instance not in self.reset_decisions:
            log.info("%s:%s: %s", instance.record_db, instance.record_id, decision.reason)
        self.reset_decisions[instance] = decision

    def stop(self) -> None:
        self.stopping = True
        self.queue.close()
        for slot in self.slots:
            if slot.thread.ident is not None:  # started
                slot.thread.join(10)
        leftovers = self.queue.drain()
        for slot in self.slots:
            leftovers += [job for jobs in slot.inflight for job in jobs] + list(slot.directed)
        for job in leftovers:
            self.fail(job, RequestError("UNAVAILABLE", "the replay server is shutting down; retry on another server"))

    # -- state -------------------------------------------------------------------
    @property
    def serving(self) -> bool:
        return not all(slot.gave_up for slot in self.slots)

    @property
    def workers_ready(self) -> int:
        return sum(1 for slot in self.slots if slot.ready)

    @property
    def held_bytes(self) -> int:
        return sum(slot.held_bytes for slot in self.slots)

    def start_errors(self) -> str:
        return "; ".join(f"{s.name}: {s.last_start_error}" for s in self.slots if s.last_start_error)

    def slot_changed(self, info: dict | None = None) -> None:
        if info:
            self.device = dict(info)
            arch_was_known = bool(self.arch)
            self.arch = info.get("arch", self.arch)
            if self.arch and not arch_was_known:  # jobs that came before the first worker: compile them now
                for job in self.queue.snapshot():
                    self.request_compile(job)
        self.metrics.workers_ready.set(self.workers_ready)
        self.metrics.prepared_bytes.set(self.held_bytes)
        if not self.serving:
            self._on_health(False)
            for job in self.queue.drain():
                self.fail(job, self.unavailable())

    def in_flight_changed(self, delta: int) -> None:
        with self._lock:
            self.in_flight += delta
        self.metrics.in_flight.set(self.in_flight)

    def unavailable(self) -> RequestError:
        return RequestError(
            "UNAVAILABLE",
            f"no healthy replay worker on GPU {self.settings.gpu} (start-up failed "
            f"{self.settings.max_start_failures} times: {self.start_errors()}); check the GPU and driver, "
            "then restart the server",
        )

    # -- work ----------------------------------------------------------------------
    def submit(self, job: Job) -> Job:
        if not self.serving or self.stopping:
            raise self.unavailable() if not self.serving else RequestError("UNAVAILABLE", "server shutting down")
        job.future.add_done_callback(lambda future, job=job: self._on_job_done(job, future))
        self.request_compile(job)  # compiles start on arrival, ahead of the workers
        self.queue.put(job)
        return job

    def _on_job_done(self, job: Job, future: Any) -> None:
        if future.cancelled():  # the caller hung up: its job leaves the queue now
            job.cancelled = True
            self.metrics.cancelled.inc()
            self.queue.discard_cancelled()

    def request_compile(self, job: Job, arch: str = "") -> None:
        """Start the job's compile in the CPU pool (once; needs the GPU arch a worker reported). Its end
        wakes the idle workers. Never called with the queue's lock held (compile-pool callbacks take it).
        The recorded launch's code is not compiled there: the worker has it from preparing the instance."""
        arch = arch or self.arch
        if self.compile_cache is None or job.kind != "run" or not arch or job.config.runs_recorded_code():
            return
        with self._compile_lock:  # the first worker's start and a worker's dispatch may both ask
            if job.compiled is not None:
                return
            compiled, job.compile_hit = self.compile_cache.request_counted(job.instance, job.config, arch)
            job.compiled = compiled
        compiled.add_done_callback(lambda _, job=job: self._compiled(job))

    def _compiled(self, job: Job) -> None:
        """``job``'s compile ended: the workers waiting for a ready job look again."""
        job.code_done = True
        self.queue.wake()

    def prepare_everywhere(self, job_factory: Callable[[], Job]) -> list[Job]:
        """One prepare job per live worker (each holds its own prepared instances)."""
        jobs = []
        for slot in self.slots:
            if slot.gave_up:
                continue
            job = job_factory()
            with slot._lock:
                slot.directed.append(job)
            jobs.append(job)
        if not jobs:
            raise self.unavailable()
        return jobs

    def complete_answers(self, answers: list[tuple[Job, tuple]], worker: str) -> None:
        """Jobs and their worker's answers ((job_id, result_bytes, summary): the ``Result`` message
        serialized, and its status, failed, verified, executed and mean measured ns): counted (the
        metrics once per message), and sent on as they are."""
        now = time.monotonic()
        outcomes: collections.Counter = collections.Counter()
        ready = []
        for job, (_, result_bytes, summary) in answers:
            if job.compile_hit and job.compiled is not None and job.compiled.exception() is None:
                result_bytes += COMPILE_CACHED_FIELD
            status, failed, verified, executed, mean_ns = summary
            outcomes[(status, failed, verified)] += 1
            self.metrics.replay_latency.observe(now - job.submitted_at)
            if executed and mean_ns:
                self.metrics.kernel_time.observe(mean_ns / 1e9)
            ready.append((job, result_bytes))
        for (status, failed, verified), count in outcomes.items():
            self.metrics.count_result(status, failed, verified, count)
        with self._lock:
            self.completed += len(answers)
        for job, result_bytes in ready:  # (counted first: a caller that has its result finds it counted)
            if not job.future.done():
                job.future.set_result(JobOutcome(None, worker, job.dispatched_at - job.submitted_at,
                                                 now - job.submitted_at, result_bytes=result_bytes))

    def complete(self, job: Job, result: ExperimentResult, worker: str) -> None:
        if job.compile_hit and job.compiled is not None and job.compiled.exception() is None:
            result.compile_cached = True
        now = time.monotonic()
        self.metrics.count_result(result.status, result.failed, result.verified)
        self.metrics.replay_latency.observe(now - job.submitted_at)
        measured = result.measured_times
        if result.executed and measured:
            self.metrics.kernel_time.observe(sum(measured) / len(measured) / 1e9)
        with self._lock:
            self.completed += 1
        if not job.future.done():
            job.future.set_result(
                JobOutcome(result, worker, job.dispatched_at - job.submitted_at, now - job.submitted_at)
            )

    def complete_prepare(self, job: Job, instance_bytes: int, worker: str) -> None:
        now = time.monotonic()
        if not job.future.done():
            job.future.set_result(
                JobOutcome(ExperimentResult(), worker, job.dispatched_at - job.submitted_at,
                           now - job.submitted_at, device_bytes=instance_bytes)
            )

    def fail_guilty(self, job: Job, status: str, error: str, worker: str) -> None:
        """The job whose replay took its worker down: a failed result, not an RPC error."""
        result = ExperimentResult.failure(status, error, warmup=job.warmup, gpu_id=self.settings.gpu)
        if job.kind == "prepare":
            self.fail(job, RequestError("INTERNAL", f"preparing the instance killed the worker: {error}"))
            return
        self.complete(job, result, worker)

    def fail(self, job: Job, error: RequestError) -> None:
        if not job.future.done():
            if not job.started:
                job.claim()
            if not job.future.done():
                job.future.set_exception(error)
