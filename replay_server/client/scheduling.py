"""What the executor sends where and when, and when it gives up: the pure part of its dispatcher.

No gRPC, no asyncio, no clock of its own (callers pass ``now``): the backlog of waiting
configurations, each server's room and the code it has compiled or is compiling, the compile-aware
choice of a server's next configuration, retries and the give-up rules. ``AsyncReplayExecutor``
(:mod:`replay_server.client.executor`) runs it on its event loop's thread, which owns this state;
``tests/replay_server/client/test_scheduling.py`` runs it without servers.
"""

from __future__ import annotations

import collections
import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

from mneme.model.experiment import ExperimentConfiguration

#: Waiting configurations the dispatcher looks through for one a server can run without a compile wait.
LOOKAHEAD = 64
#: Configurations sent to a server for code it is still compiling (for the first of them), at most.
SENT_PER_COMPILE = 2
#: Requests a stream sends an idle server in one round, at most: they go out at once as a message of
#: their own, and the rest of its places are filled a moment later, so that its workers start and its
#: compiles begin while the dispatcher still prepares the rest (a full window takes milliseconds of
#: Python, and a stream's message leaves only when the dispatcher lets go of the interpreter).
FIRST_MESSAGE = 8
#: The longest a server that went away is left out before it is tried again (seconds); the first
#: back-off is half a second, doubling with each failure in a row.
MAX_BACKOFF = 10.0
#: The code of the recorded launch's knobs: preparing an instance compiles it on the server.
RECORDED_CODE = ExperimentConfiguration().code_identity()


def server_capacity(workers: int, transport: str = "stream") -> int:
    """Requests one server holds at once; the rest waits in the client.

    Per worker, the two it has been handed (the server's pipelining) and more
    waiting in the server's queue, so that a worker finds its next job there
    while results travel back and the client sends the next requests, and can
    take a job whose code is compiled ahead of one still compiling.

    ``unary``: two waiting per worker and four to spare, at most 48: a server
    answers RESOURCE_EXHAUSTED beyond 60 calls at once (``rpc_threads`` 64
    less 4). ``stream``: one call carries them all, and no thread limit holds,
    so the queue is deeper, 48 per worker and eight to spare: a worker takes up
    to 8 ready configurations of an instance in one message and has two
    messages in hand, and several more groups wait in the server's queue while
    answers travel back in bursts and the client sends the next requests (24
    per worker left the worker waiting for messages: short kernels replayed
    a quarter slower, ``bench/sweep_pace.py``).

    Args:
        workers: the server's worker processes (``ServerInfo.workers``).
        transport: ``stream`` or ``unary``.

    Returns:
        How many requests the server may hold.
    """
    workers = max(1, workers)
    if transport == "unary":
        return min(workers * 4 + 4, 48)
    return min(workers * 48 + 8, 512)


@dataclass(slots=True)  # one per configuration submitted: slots make it cheaper to create
class Task:
    """One submitted configuration, until its result is taken."""

    config: ExperimentConfiguration
    future: Any  # what the caller waits on (the executor's ReplayFuture)
    request_id: str
    attempts: int = 0
    stranded_since: float | None = None  # since when no server could take it
    errors: list[str] | None = None  # why attempts failed (made with the first)
    finished: bool = False  # its result is taken (the executor delivers it at the end of its round)
    _code: tuple | None = None

    @property
    def code(self) -> tuple:
        """The configuration's ``code_identity``: tasks with equal ``code`` share a compile.
        (Computed when the scheduler first needs it, not at submission.)"""
        if self._code is None:
            self._code = self.config.code_identity()
        return self._code


@dataclass(eq=False)
class ServerState:
    """What the scheduler knows of one server."""

    address: str
    capacity: int = 4
    outstanding: int = 0
    down_until: float = 0.0
    failures: int = 0
    compiled: set[tuple] = field(default_factory=set)  # codes this server answered a configuration of
    compiling: dict[tuple, int] = field(default_factory=dict)  # codes sent, not answered yet: how many tasks
    retired: bool = False  # gets no new work (its announcement expired: replay_server.discovery)

    def available(self, now: float) -> bool:
        return now >= self.down_until and self.outstanding < self.capacity and not self.retired


def give_up_reason(task: Task, why: str) -> str:
    """The error of a configuration given up on: ``why``, and the last failures of its attempts."""
    detail = "; ".join((task.errors or [])[-3:]) or "no server answered"
    return f"replay server lost: {why} ({detail}); check that the servers are running (mneme serve)"


class Scheduler:
    """The backlog and the servers' bookkeeping; every method runs in one thread (the executor's loop).

    Args:
        max_attempts: attempts of a configuration whose server failed it retryably before it is given up.
        retry_window: seconds waiting work may go without any server up before it is given up.
        first_message: requests an idle server gets in one round (``FIRST_MESSAGE`` for a stream; None:
            no such limit, as for unary calls, which leave at once).
    """

    def __init__(self, max_attempts: int, retry_window: float, first_message: int | None = FIRST_MESSAGE) -> None:
        self.max_attempts = max_attempts
        self.retry_window = retry_window
        self.first_message = first_message
        self.backlog: "collections.deque[Task]" = collections.deque()
        self.servers: list[ServerState] = []

    def idle(self) -> bool:
        """Nothing waits and no server holds anything."""
        return not self.backlog and all(s.outstanding == 0 for s in self.servers)

    # -- servers ------------------------------------------------------------------------
    def join(self, server: ServerState) -> ServerState | None:
        """``server`` takes work from now on; if its address is known already, the earlier one does again
        and is returned (the new connection is not needed)."""
        earlier = next((s for s in self.servers if s.address == server.address), None)
        if earlier is None:
            self.servers.append(server)
        else:
            earlier.retired = False
        return earlier

    def retire(self, address: str) -> None:
        """The server at ``address`` gets no new work."""
        for server in self.servers:
            server.retired = server.retired or server.address == address

    def prepared(self, server: ServerState, compiled_ahead: Any = ()) -> None:
        """``server`` prepared the instance: it has the recorded launch's code and ``compiled_ahead``'s."""
        server.compiled.add(RECORDED_CODE)
        server.compiled.update(compiled_ahead)

    # -- sending --------------------------------------------------------------------------
    def pump(self, now: float, send: Callable[[Task, ServerState], None],
             give_up: Callable[[Task, str], None]) -> bool:
        """Hand waiting tasks to servers with room (``send(task, server)``, counted here), least loaded
        first; give a task up (``give_up(task, reason)``, which must finish it) only when no server has
        been up for ``retry_window``.

        Returns:
            True when a server that was idle got its ``first_message`` and could take more: the next
            round should come right after the streams have sent this one's.
        """
        servers = self.servers
        if not any(now >= s.down_until and not s.retired for s in servers):
            window = self.retry_window
            for task in self.backlog:
                task.stranded_since = task.stranded_since or now
                if now - task.stranded_since > window and not task.finished:
                    give_up(task, f"no replay server reachable for {window:g}s")
            self.backlog = collections.deque(t for t in self.backlog if not t.finished)
            return False
        first = self.first_message
        # An idle server's first requests go out before the rest of its places are filled.
        idle = {id(s) for s in servers if s.outstanding == 0} if first else ()
        # Servers with room, least loaded first (index: the earlier one of equally loaded servers). A server
        # that has nothing it could start now, or has had its first message's worth, leaves the heap.
        room = [(s.outstanding / s.capacity, i, s) for i, s in enumerate(servers) if s.available(now)]
        heapq.heapify(room)
        backlog = self.backlog
        more_now = False
        while backlog and room:
            _, index, server = heapq.heappop(room)
            if id(server) in idle and server.outstanding >= first:
                more_now = True
                continue
            task = self.take_for(server)
            if task is None:
                continue
            if not task.finished:
                task.attempts += 1
                task.stranded_since = None
                server.outstanding += 1
                code = task.code
                if code not in server.compiled:
                    server.compiling[code] = server.compiling.get(code, 0) + 1
                send(task, server)
            if server.available(now):
                heapq.heappush(room, (server.outstanding / server.capacity, index, server))
        return more_now

    def take_for(self, server: ServerState) -> Task | None:
        """The first waiting task ``server`` can start without waiting for a compile it is already doing.

        A server's place for a configuration is better used by one whose code it has (or whose compile it
        has not started: sending it starts that compile) than by a configuration that would wait behind a
        compile in progress there; at most ``SENT_PER_COMPILE`` of those are sent, and the rest follow as
        soon as the first answer shows the code compiled. So while a new variant compiles, the server runs
        the configurations of code it already has.
        """
        backlog, compiled, compiling = self.backlog, server.compiled, server.compiling
        for index, task in enumerate(itertools.islice(backlog, LOOKAHEAD)):
            code = task.code
            if code in compiled or compiling.get(code, 0) < SENT_PER_COMPILE:
                del backlog[index]
                return task
        return None

    # -- answers -------------------------------------------------------------------------
    def release(self, task: Task, server: ServerState) -> None:
        """``server`` answered ``task``, whatever the answer: its place is free."""
        server.outstanding -= 1
        compiling = server.compiling
        code = task.code
        if code in compiling:
            compiling[code] -= 1
            if not compiling[code]:
                del compiling[code]

    def replayed(self, task: Task, server: ServerState) -> None:
        """``server`` replayed ``task`` (:meth:`release`): it is up, and has ``task``'s code compiled."""
        self.release(task, server)
        server.failures = 0
        server.compiled.add(task.code)

    def failed(self, task: Task, server: ServerState, error: str, went_away: bool, now: float) -> str | None:
        """``server`` failed ``task`` in a way worth a retry (``went_away``: the server, or the way to it,
        is gone: it is left out for a back-off). The task waits again, first in line, unless it had its
        ``max_attempts``.

        Returns:
            Why the task is given up, or None when it waits for another attempt.
        """
        if went_away:
            server.failures += 1
            server.down_until = now + min(0.5 * 2 ** (server.failures - 1), MAX_BACKOFF)
        task.errors = (task.errors or []) + [f"{server.address}: {error}"]
        if task.attempts >= self.max_attempts:
            return f"{task.attempts} attempts failed"
        self.backlog.appendleft(task)
        return None
