"""The study server's core and a front, in one process: the journal they write is the study Optuna reads,
their refusals are Optuna's, and a front's replica sends the trials Optuna's proxy would."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.distributions import FloatDistribution, IntDistribution, distribution_to_json, json_to_distribution
from optuna.storages._grpc.auto_generated import api_pb2
from optuna.storages._grpc.servicer import _from_proto_trial, _to_proto_trial
from optuna.storages.journal import JournalFileBackend, JournalStorage

from tuner.strategies.shared_study import DUPLICATE_ATTR, HASH_ATTR
from tuner.strategies.study_rows import trials_of
from tuner.study_core import APPLY, SYNC, StudyCore
from tuner.study_fronts import Front, _Refused

X = distribution_to_json(IntDistribution(1, 10))


class Server:
    """A core with two fronts, their pipes replaced by calls."""

    def __init__(self, path) -> None:
        self.core = StudyCore(path, 2)
        self.fronts = [Front(self.core.settings()) for _ in range(2)]

    def close(self) -> None:
        self.core.close()
        for front in self.fronts:
            front.close()

    def optuna(self, front: int, name: str, **fields):
        request = getattr(api_pb2, f"{name}Request")(**fields)
        answer = self.core.answer(front, f"/optuna.StorageService/{name}".encode(), request.SerializeToString())
        self.core.flush()
        status, body = self.fronts[front].take(answer)
        assert status == 0, body
        return getattr(api_pb2, f"{name}Reply").FromString(body)

    def apply(self, front: int, ops: list, tolerate: int = 0, changes: dict | None = None):
        request = {"ops": ops, "tolerate": tolerate, **({"changes": changes} if changes else {})}
        try:
            payload, parsed, starts = self.fronts[front].apply_request(json.dumps(request).encode())
        except _Refused as exc:
            return exc.args
        status, body = self.fronts[front].take(self.core.answer(front, APPLY, payload))
        self.core.flush()
        if status:
            return tuple(body)
        return json.loads(self.fronts[front].apply_answer(body, parsed, starts))

    def look(self, front: int, study_id: int, since: int = 0, generation: str = "", user_attrs=None) -> tuple:
        """(the head, the trials) of a ``Changes`` call, in Optuna's form; the JSON form says the same."""
        self.fronts[front].take(self.core.answer(front, SYNC, b""))
        request = {"study_id": study_id, "since": since, "generation": generation,
                   **({"user_attrs": user_attrs} if user_attrs is not None else {})}
        data = self.fronts[front].changes_answer(request)
        size = int.from_bytes(data[:4], "big")
        head = json.loads(data[4:4 + size])
        trials = list(api_pb2.GetTrialsReply.FromString(data[4 + size:]).trials)
        data = self.fronts[front].changes_answer({**request, "form": "json"})
        size = int.from_bytes(data[:4], "big")
        assert json.loads(data[4:4 + size]) == {**head, "form": "json"}
        table, rows = json.loads(data[4 + size:])
        assert [from_row(row, table) for row in rows] == [plain(t) for t in trials]
        assert [vars(t) for t in trials_of([table, rows])] == [vars(_from_proto_trial(t)) for t in trials]
        return head, trials


def plain(trial: api_pb2.Trial) -> dict:
    """A proxy's trial as values (attribute texts decoded: their spacing is not the trial's)."""
    return {"trial_id": trial.trial_id, "number": trial.number, "state": trial.state, "values": list(trial.values),
            "datetime_start": trial.datetime_start, "datetime_complete": trial.datetime_complete,
            "params": dict(trial.params), "distributions": dict(trial.distributions),
            "user": {k: json.loads(v) for k, v in trial.user_attributes.items()},
            "system": {k: json.loads(v) for k, v in trial.system_attributes.items()},
            "intermediate": dict(trial.intermediate_values)}


def from_row(row: list, table: dict) -> dict:
    """A trial of the JSON form as :func:`plain` has it (its distributions from the answer's ``table``)."""
    trial_id, number, state, values, start, end, params, kept, user, system, steps = row
    distributions = table[str(kept)]
    internal = {name: json_to_distribution(distributions[name]).to_internal_repr(value) for name, value in params.items()}
    return {"trial_id": trial_id, "number": number, "state": state, "values": values, "datetime_start": start,
            "datetime_complete": end, "params": internal, "distributions": distributions, "user": user,
            "system": system, "intermediate": {int(step): value for step, value in steps.items()}}


def as_optuna_sends(path) -> list[dict]:
    storage = JournalStorage(JournalFileBackend(str(path)))
    study_id = storage.get_study_id_from_name("s")
    return [plain(_to_proto_trial(t)) for t in storage.get_all_trials(study_id, deepcopy=False)]


def test_the_journal_is_the_study_optuna_reads_and_the_replicas_send_it(tmp_path):
    path = tmp_path / "study.log"
    server = Server(path)
    study_id = server.optuna(0, "CreateNewStudy", study_name="s", directions=[api_pb2.MINIMIZE]).study_id
    server.optuna(0, "SetStudySystemAttribute", study_id=study_id, key="k", value=json.dumps([1]))
    waiting = optuna.trial.create_trial(state=optuna.trial.TrialState.WAITING, params={"x": 3},
                                        distributions={"x": IntDistribution(1, 10)}, system_attrs={HASH_ATTR: "h0"})
    enqueued = server.optuna(0, "CreateNewTrial", study_id=study_id, template_trial=_to_proto_trial(waiting),
                             template_trial_is_none=False).trial_id

    made = server.apply(1, [["create_new_trial", study_id]] * 3)["results"]
    t1, t2, t3 = (m["trial_id"] for m in made)
    assert [m["number"] for m in made] == [1, 2, 3]
    ops = [["set_trial_param", t, "x", float(t), X] for t in (t1, t2, t3)]
    ops += [["claim", study_id, t1, "h1"], ["claim", study_id, t2, "h1"], ["claim", study_id, t3, "h0"]]
    results = server.apply(1, ops)["results"]
    assert results[3:] == [1, 1, 3]  # the second claim of h1 is a duplicate of trial 1; h0's WAITING trial has
    # no claim until taken
    server.apply(1, [["set_trial_user_attrs", t1, {"status": "verified", "mneme": {"worker": "w", "t": [1, 2]}}],
                     ["set_trial_state_values", t1, "COMPLETE", [1.5]],
                     ["set_trial_state_values", t2, "FAIL", None]])

    # Refusals, as Optuna's storage makes them; kept changes (tolerated) answer an error and the rest goes on.
    kept = server.apply(0, [["set_trial_param", t1, "y", 1.0, X], ["set_trial_system_attr", t3, "seen", True]],
                        tolerate=1)["results"]
    assert kept[0]["error"].startswith("UpdateFinishedTrialError") and kept[1] is None
    assert server.apply(0, [["set_trial_param", t1, "y", 1.0, X]])[0] == "FAILED_PRECONDITION"
    assert server.apply(0, [["set_trial_param", t3, "x", 1.0, distribution_to_json(FloatDistribution(0, 1))]])[0] \
        == "INVALID_ARGUMENT"
    assert server.apply(0, [["set_trial_system_attr", 999, "k", 1]])[0] == "NOT_FOUND"
    assert server.apply(0, [["set_trial_state_values", t3, "NO_SUCH_STATE", None]])[0] == "NOT_FOUND"
    assert server.apply(0, [["no_such_op", 1]])[0] == "INVALID_ARGUMENT"

    # A WAITING trial is taken once.
    taken = server.apply(0, [["set_trial_state_values", enqueued, "RUNNING", None]])["results"]
    again = server.apply(1, [["set_trial_state_values", enqueued, "RUNNING", None]])["results"]
    assert (taken, again) == ([True], [False])
    server.optuna(1, "SetTrialIntermediateValue", trial_id=t3, step=2, intermediate_value=0.5)
    server.optuna(1, "SetTrialUserAttribute", trial_id=t3, key="note", value=json.dumps({"a": 1}))

    # Front 0 reads the news it has not sent itself: every change, the user attributes it asks for.
    head, trials = server.look(0, study_id, user_attrs=["status"])
    assert head["generation"] == server.core.generation
    assert {t.trial_id: dict(t.user_attributes) for t in trials}[t1] == {"status": '"verified"'}
    head2, since = server.look(0, study_id, head["cursor"], head["generation"])
    assert since == []
    server.apply(1, [["set_trial_state_values", t3, "COMPLETE", [0.25]]])
    assert [t.trial_id for t in server.look(0, study_id, head["cursor"], head["generation"])[1]] == [t3]
    with pytest.raises(_Refused, match="NOT_FOUND"):
        server.look(0, 42)
    server.close()

    expected = as_optuna_sends(path)
    assert expected[t2]["system"] == {HASH_ATTR: "h1", DUPLICATE_ATTR: 1}
    assert expected[t1]["user"]["mneme"] == {"worker": "w", "t": [1, 2]}
    for front in server.fronts:
        assert [plain(t.message()) for t in front.replica.trials] == expected

    # A new server on the journal: the same study, the claims in it hold.
    again = Server(path)
    _, trials = again.look(1, study_id)
    assert [plain(t) for t in trials] == expected
    late = again.apply(0, [["create_new_trial", study_id]])["results"][0]["trial_id"]
    assert again.apply(0, [["claim", study_id, late, "h1"]])["results"] == [1]
    again.close()


def test_a_batch_stops_at_its_first_refusal_and_keeps_what_came_before(tmp_path):
    server = Server(tmp_path / "study.log")
    study_id = server.optuna(0, "CreateNewStudy", study_name="s", directions=[api_pb2.MINIMIZE]).study_id
    (made,) = server.apply(0, [["create_new_trial", study_id]])["results"]
    trial = made["trial_id"]
    refused = server.apply(0, [["set_trial_system_attr", trial, "a", 1], ["set_trial_param", trial, "x", "nan?", X],
                               ["set_trial_system_attr", trial, "b", 2]])
    assert refused[0] == "INVALID_ARGUMENT"
    _, (seen,) = server.look(0, study_id)
    assert dict(seen.system_attributes) == {"a": "1"}  # before the refusal: applied; after it: not
    server.close()
    storage = JournalStorage(JournalFileBackend(str(tmp_path / "study.log")))
    assert storage.get_trial(trial).system_attrs == {"a": 1}


def test_a_reader_may_leave_out_running_trials_no_claim_tags_until_they_change(tmp_path):
    server = Server(tmp_path / "study.log")
    study_id = server.optuna(0, "CreateNewStudy", study_name="s", directions=[api_pb2.MINIMIZE]).study_id
    made = [m["trial_id"] for m in server.apply(0, [["create_new_trial", study_id]] * 4)["results"]]
    server.apply(0, [["set_trial_param", made[0], "x", 2.0, X], ["claim", study_id, made[0], "h"],
                     ["set_trial_state_values", made[1], "FAIL", None]])

    def read(since: int = 0, generation: str = "") -> tuple[dict, list[int]]:
        server.fronts[1].take(server.core.answer(1, SYNC, b""))
        data = server.fronts[1].changes_answer({"study_id": study_id, "since": since, "generation": generation,
                                                "form": "json", "unclaimed": False})
        size = int.from_bytes(data[:4], "big")
        return json.loads(data[4:4 + size]), [t._trial_id for t in trials_of(json.loads(data[4 + size:]))]

    head, seen = read()
    assert seen == made[:2]  # the claimed one and the finished one; the two made ahead are left out
    assert [t.trial_id for t in server.look(1, study_id)[1]] == made  # (a reader that does not ask: all)
    server.apply(0, [["claim", study_id, made[3], "h3"]])
    head, seen = read(head["cursor"], head["generation"])
    assert seen == [made[3]]
    server.apply(0, [["set_trial_state_values", made[2], "FAIL", None]])  # (released: finished)
    assert read(head["cursor"], head["generation"])[1] == [made[2]]
    with pytest.raises(_Refused, match="INVALID_ARGUMENT"):
        server.fronts[1].changes_answer({"study_id": study_id, "since": 0, "generation": "", "unclaimed": "no"})
    server.close()


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "America/St_Johns", "Australia/Lord_Howe"])
def test_times_are_sent_in_local_time_as_optunas_proxy_sends_them(zone, monkeypatch):
    """A front's UTC times, found once a second, are the local times the proxy sends (across changes of offset)."""
    import datetime
    import random
    import time

    from tuner import study_replica

    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        study_replica._SECONDS.clear()
        study_replica._OFFSETS.clear()
        rng = random.Random(zone)
        start = datetime.datetime(2026, 3, 28, tzinfo=datetime.timezone.utc)
        for i in range(3000):
            moment = start + datetime.timedelta(seconds=rng.randrange(86400 * 220),
                                                microseconds=rng.randrange(10 ** 6) if i % 5 else 0)
            text = moment.isoformat(timespec="microseconds")
            local = moment.astimezone().replace(tzinfo=None)
            assert study_replica._local(text) == local.isoformat(sep=" ", timespec="microseconds"), text
            assert study_replica._local(text[:19] + "+00:00") == local.replace(microsecond=0).isoformat(
                sep=" ", timespec="microseconds")
    finally:
        monkeypatch.undo()
        time.tzset()
        study_replica._SECONDS.clear()
        study_replica._OFFSETS.clear()
