"""The executor's scheduling rules, without servers, gRPC or an event loop (replay_server.client.scheduling)."""

from __future__ import annotations

import pytest

from mneme.model.experiment import ExperimentConfiguration
from replay_server.client.scheduling import (
    FIRST_MESSAGE,
    LOOKAHEAD,
    MAX_BACKOFF,
    SENT_PER_COMPILE,
    Scheduler,
    ServerState,
    Task,
    give_up_reason,
    server_capacity,
)

RECORDED = ExperimentConfiguration()  # the recorded launch's code


def task(n: int, passes: str | None = None, block_x: int = 64) -> Task:
    """Task ``r-n``: the recorded launch's code in another block shape, or the code of ``passes``."""
    config = ExperimentConfiguration.from_dict({"block": {"x": block_x}, **({"passes": passes} if passes else {})})
    return Task(config, None, f"r-{n}")


def scheduler(*servers: ServerState, first_message: int | None = None, max_attempts: int = 3,
              retry_window: float = 60.0) -> Scheduler:
    s = Scheduler(max_attempts, retry_window, first_message)
    for server in servers:
        s.join(server)
    return s


class Sent:
    """The ``send`` and ``give_up`` callbacks: what went where, and what was given up (and why)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self.given_up: list[tuple[str, str]] = []

    def send(self, task: Task, server: ServerState) -> None:
        self.sent.append((task.request_id, server.address))

    def give_up(self, task: Task, why: str) -> None:
        task.finished = True
        self.given_up.append((task.request_id, why))

    def to(self, address: str) -> list[str]:
        return [request for request, where in self.sent if where == address]


def test_capacity_per_transport():
    assert server_capacity(2) == 104 and server_capacity(2, "unary") == 12
    assert server_capacity(0) == 56  # at least one worker
    assert server_capacity(100, "unary") == 48 and server_capacity(100) == 512


def test_work_goes_to_the_least_loaded_server_and_is_counted():
    a, b = ServerState("a", capacity=4), ServerState("b", capacity=4)
    s, out = scheduler(a, b), Sent()
    s.prepared(a)
    s.prepared(b)
    s.backlog.extend(task(i) for i in range(10))
    assert not s.pump(0.0, out.send, out.give_up)
    assert len(out.to("a")) == len(out.to("b")) == 4 and len(s.backlog) == 2  # both full, two wait
    assert a.outstanding == b.outstanding == 4 and not a.available(0.0)
    assert all(t.attempts == 0 for t in s.backlog)
    assert not s.idle()


def test_an_idle_stream_gets_its_first_message_alone():
    server = ServerState("a", capacity=24)
    s, out = scheduler(server, first_message=FIRST_MESSAGE), Sent()
    s.prepared(server)
    s.backlog.extend(task(i) for i in range(40))
    assert s.pump(0.0, out.send, out.give_up)  # more could go: the next round comes right after
    assert len(out.sent) == FIRST_MESSAGE
    assert not s.pump(0.0, out.send, out.give_up)
    assert len(out.sent) == 24  # the rest of its places, in the next round
    unary = ServerState("u", capacity=12)
    s, out = scheduler(unary), Sent()  # no first-message limit (unary calls leave at once)
    s.prepared(unary)
    s.backlog.extend(task(i) for i in range(40))
    assert not s.pump(0.0, out.send, out.give_up) and len(out.sent) == 12


def test_configurations_waiting_for_a_compile_do_not_take_every_place():
    server = ServerState("a", capacity=8)
    s, out = scheduler(server), Sent()
    s.prepared(server)
    slow = [task(i, "default<O1>") for i in range(6)]
    ready = [task(10 + i) for i in range(3)]  # the recorded code: compiled by Prepare
    s.backlog.extend(slow + ready)
    s.pump(0.0, out.send, out.give_up)
    assert out.sent == [(t.request_id, "a") for t in slow[:SENT_PER_COMPILE] + ready]
    assert server.compiling == {slow[0].code: SENT_PER_COMPILE}
    s.replayed(slow[0], server)  # the first answer: the code is compiled there now
    assert server.compiling == {slow[0].code: 1} and slow[0].code in server.compiled
    s.pump(0.0, out.send, out.give_up)
    assert [r for r, _ in out.sent[5:]] == [t.request_id for t in slow[2:6]]


def test_the_dispatcher_looks_only_so_far_ahead():
    server = ServerState("a", capacity=1000)
    s, out = scheduler(server), Sent()
    s.prepared(server)
    s.backlog.extend(task(i, "default<O1>") for i in range(LOOKAHEAD + 10))
    s.backlog.append(task(999))  # compiled code, beyond the lookahead
    s.pump(0.0, out.send, out.give_up)
    assert [r for r, _ in out.sent] == ["r-0", "r-1"]  # two of the compiling code, then nothing it could start


def test_a_server_that_went_away_backs_off_and_its_work_is_retried_first():
    a = ServerState("a", capacity=4)
    s, out = scheduler(a), Sent()
    s.prepared(a)
    t = task(1)
    s.backlog.extend([t, task(2)])
    s.pump(0.0, out.send, out.give_up)
    s.release(t, a)
    assert s.failed(t, a, "UNAVAILABLE: gone", went_away=True, now=100.0) is None
    assert s.backlog[0] is t and t.errors == ["a: UNAVAILABLE: gone"] and a.down_until == 100.5
    s.backlog.popleft()
    for failures in range(2, 8):
        s.failed(t, a, "UNAVAILABLE: gone", went_away=True, now=100.0)
        s.backlog.popleft()
    assert a.down_until == 100.0 + MAX_BACKOFF  # doubling, capped
    s.failed(t, a, "INTERNAL: oops", went_away=False, now=200.0)
    assert a.down_until == 100.0 + MAX_BACKOFF  # a failure of the request: the server stays in
    s.replayed(task(3), a)
    assert a.failures == 0


def test_a_configuration_is_given_up_after_its_attempts():
    a = ServerState("a", capacity=4)
    s, out = scheduler(a, max_attempts=2), Sent()
    s.prepared(a)
    t = task(1)
    s.backlog.append(t)
    for attempt in (1, 2):
        s.pump(1000.0 * attempt, out.send, out.give_up)
        assert t.attempts == attempt
        s.release(t, a)
        why = s.failed(t, a, f"UNAVAILABLE: try {attempt}", went_away=True, now=1000.0 * attempt)
    assert why == "2 attempts failed" and not s.backlog and s.idle()
    reason = give_up_reason(t, why)
    assert reason.startswith("replay server lost: 2 attempts failed (a: UNAVAILABLE: try 1; a: UNAVAILABLE: try 2)")
    assert "mneme serve" in give_up_reason(task(2), "x") and "no server answered" in give_up_reason(task(2), "x")


def test_work_is_given_up_only_after_no_server_was_up_for_the_retry_window():
    a = ServerState("a", capacity=4, down_until=1000.0)
    s, out = scheduler(a, retry_window=5.0), Sent()
    s.backlog.extend([task(1), task(2)])
    s.pump(10.0, out.send, out.give_up)
    s.pump(15.0, out.send, out.give_up)
    assert not out.given_up and len(s.backlog) == 2  # stranded for 5 s: not longer than the window yet
    s.pump(15.5, out.send, out.give_up)
    assert out.given_up == [("r-1", "no replay server reachable for 5s"), ("r-2", "no replay server reachable for 5s")]
    assert not s.backlog and not out.sent


def test_waiting_for_a_busy_server_is_not_stranded():
    a = ServerState("a", capacity=1)
    s, out = scheduler(a, retry_window=0.1), Sent()
    s.prepared(a)
    s.backlog.extend([task(1), task(2)])
    s.pump(0.0, out.send, out.give_up)
    s.pump(60.0, out.send, out.give_up)  # the server is up, only full
    assert not out.given_up and len(s.backlog) == 1


def test_retired_servers_get_no_work_and_come_back_when_they_join_again():
    a, b = ServerState("a", capacity=4), ServerState("b", capacity=4)
    s, out = scheduler(a, b), Sent()
    s.prepared(a)
    s.prepared(b)
    s.retire("a")
    s.backlog.extend(task(i) for i in range(3))
    s.pump(0.0, out.send, out.give_up)
    assert out.to("a") == [] and len(out.to("b")) == 3
    again = ServerState("a")
    assert s.join(again) is a and not a.retired and len(s.servers) == 2
    assert s.join(ServerState("c")) is None and len(s.servers) == 3


@pytest.mark.parametrize("ahead", [(), ("compiled-ahead",)])
def test_prepare_counts_the_recorded_code_and_the_code_compiled_ahead_as_compiled(ahead):
    a = ServerState("a")
    s = scheduler(a)
    s.prepared(a, iter(ahead))
    assert RECORDED.code_identity() in a.compiled and set(ahead) <= a.compiled
