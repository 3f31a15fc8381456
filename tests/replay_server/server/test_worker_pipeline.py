"""The worker's pipeline (``worker._serve``) in this process, with a stand-in engine that logs what it does:
a group's results are taken before anything that would wait for the GPU behind it (a group replayed when
its results are taken, ``enqueued`` False), and with another group enqueued behind, a configuration the
engine leaves unjudged (None) is not answered (the supervisor replays it alone)."""

from __future__ import annotations

import multiprocessing
import threading

from mneme.model.experiment import Dim3, ExperimentConfiguration, ExperimentResult
from replay_server.server.worker import _serve, pack_config


class Batch:
    def __init__(self, log: list, name: str, enqueued: bool, unjudged_behind: tuple = ()) -> None:
        self.log, self.name, self.enqueued, self.unjudged_behind = log, name, enqueued, unjudged_behind

    def ready(self) -> bool:
        return False  # the GPU still runs it: the next message's group goes behind it

    def results(self, enqueued_behind: bool = False) -> list:
        self.log.append(("results", self.name, enqueued_behind))
        out = []
        for block in self.name:
            if enqueued_behind and block in self.unjudged_behind:
                out.append(None)
            else:
                out.append(ExperimentResult(exec_time=[block], verified=True, executed=True, status="verified"))
        return out


class Prepared:
    healthy = True
    kernel_ns = 1000
    device_bytes = 0

    def __init__(self, log: list) -> None:
        self.log = log

    def start_many(self, requests: list) -> Batch:
        name = tuple(config.block.x for config, *_ in requests)
        enqueued = len(requests) > 1  # as Replayer.start_many: one configuration replays when its results are taken
        self.log.append(("enqueue" if enqueued else "start", name))
        return Batch(self.log, name, enqueued, unjudged_behind=(256,))

    def fallback(self):
        return None


class Cache:
    total_bytes = 0

    def __init__(self, prepared: Prepared) -> None:
        self.prepared = prepared

    def get(self, instance, factory):
        return self.prepared

    def unhealthy(self) -> bool:
        return False


def _runs(first_id: int, blocks: tuple) -> tuple:
    jobs = [(first_id + i, pack_config(ExperimentConfiguration(Dim3(64), Dim3(b))), 3, 2, None, ())
            for i, b in enumerate(blocks)]
    return ("runs", "instance", None, jobs)


def _serve_all(messages: list) -> tuple[list, list]:
    log: list = []
    supervisor, worker = multiprocessing.Pipe()
    for message in messages:  # all waiting: each group finds the next message there
        supervisor.send(message)
    supervisor.send(("stop",))
    thread = threading.Thread(target=_serve, args=(None, worker, Cache(Prepared(log)), 0), daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    sent = []
    while supervisor.poll():
        sent.append(supervisor.recv())
    return log, sent


def test_a_group_replayed_when_answered_is_answered_before_the_next_group_is_enqueued():
    log, sent = _serve_all([_runs(1, (128, 512)), _runs(3, (1024,)), _runs(4, (64, 192))])
    assert log == [
        ("enqueue", (128, 512)),
        ("start", (1024,)),  # nothing launched: it replays when its results are taken
        ("results", (128, 512), False),  # (nothing enqueued behind: the lone one waits its turn)
        ("results", (1024,), False),  # before the next group is enqueued behind it
        ("enqueue", (64, 192)),
        ("results", (64, 192), False),
    ]
    assert [m[0] for m in sent] == ["begin", "results", "begin", "results", "begin", "results"]


def test_with_a_group_enqueued_behind_an_unjudged_configuration_is_not_answered():
    log, sent = _serve_all([_runs(1, (128, 256)), _runs(3, (512, 1024))])
    assert log == [("enqueue", (128, 256)), ("enqueue", (512, 1024)), ("results", (128, 256), True),
                   ("results", (512, 1024), False)]
    answers = [[answer[0] for answer in m[1]] for m in sent if m[0] == "results"]
    assert answers == [[1], [3, 4]]  # job 2 (block 256) is given back by the supervisor, to be replayed alone


def test_the_supervisor_replays_alone_what_a_results_message_left_unanswered():
    """A "results" message answering some of its group's jobs (not the first): the message is the head's;
    the others go back to the front of the queue, each to be replayed alone (``solo``)."""
    from types import SimpleNamespace

    from replay_server.server.engine import InstanceKey
    from replay_server.server.jobs import Job
    from replay_server.server.worker_pool import WorkerSlot

    given_back, completed = [], []
    pool = SimpleNamespace(
        settings=SimpleNamespace(gpu=0, prepare_timeout=60.0), learn=lambda *a: None,
        complete_answers=lambda done, worker: completed.extend(job.id for job, _ in done),
        queue=SimpleNamespace(put_front=given_back.extend), in_flight_changed=lambda n: None,
        slot_changed=lambda *a, **k: None,
    )
    slot = WorkerSlot(pool, 0)
    jobs = [Job("run", InstanceKey("store", "db", "rec")) for _ in range(3)]
    slot.inflight.append(jobs)
    slot.process = SimpleNamespace(kill=lambda: None)
    slot._handle(("results", [(jobs[1].id, b"", ()), (jobs[2].id, b"", ())], 0, False, None))
    assert completed == [jobs[1].id, jobs[2].id] and not slot.inflight
    assert given_back == [jobs[0]] and jobs[0].solo and not jobs[1].solo
