"""``mneme study-server``: Optuna's storage proxy in front of a journal file, SQLite or PostgreSQL, with
tuner processes on ``--optuna-storage grpc://HOST:PORT`` (loopback only)."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from typing import Any

import optuna
import pytest
from test_shared_study import check_cooperation

from mneme.cli import main
from mneme.errors import ConfigurationError
from tuner.strategies.shared_study import open_storage
from tuner.study_server import serve


class StudyServer:
    """``tuner.study_server.serve`` in a thread of the test, on a free loopback port."""

    def __init__(self, url: str, fronts: int = 0) -> None:
        self.stop = threading.Event()
        lines: list[str] = []
        announced = threading.Event()

        def announce(line: str) -> None:
            lines.append(line)
            announced.set()

        self.thread = threading.Thread(target=serve, args=(url, "127.0.0.1", 0),
                                       kwargs={"announce": announce, "stop": self.stop, "fronts": fronts},
                                       daemon=True)
        self.thread.start()
        assert announced.wait(30), "the study server did not start"
        self.url = lines[0].rsplit("--optuna-storage ", 1)[1].rstrip(")")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


@pytest.fixture
def study_server(request, tmp_path):
    servers = []

    def start(url: str, fronts: int = 0) -> StudyServer:
        servers.append(StudyServer(url, fronts))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.mark.parametrize("backend, fronts", [("journal", 0), ("sqlite", 0), ("journal", 2)])
def test_two_processes_share_a_study_through_the_study_server(tmp_path, study_server, backend, fronts):
    url = f"journal:{tmp_path / 'study.log'}" if backend == "journal" else f"sqlite:///{tmp_path / 'study.db'}"
    server = study_server(url, fronts)
    assert server.url.startswith("grpc://127.0.0.1:")
    check_cooperation(tmp_path, server.url)  # no configuration twice, user attributes, the merged report


def test_front_processes_carry_every_call_and_its_status(tmp_path, study_server):
    """With --fronts, gRPC is served by other processes on one port: Optuna's methods, mneme's Apply, and a
    refused call's status (NOT_FOUND, INVALID_ARGUMENT) reach the tuner as the single process gives them."""
    import json

    import grpc

    from tuner.strategies.shared_study import APPLY_METHOD

    path = tmp_path / "study.log"
    server = study_server(f"journal:{path}", fronts=2)
    clients = [open_storage(server.url) for _ in range(4)]  # connections the kernel spreads over the fronts
    optuna.create_study(storage=clients[0], study_name="fronts")
    for i, client in enumerate(clients):
        trial = optuna.load_study(study_name="fronts", storage=client).ask()
        trial.suggest_int("x", 1, 10)
        trial.suggest_categorical("kind", ["a", "b"])
        trial.report(0.5 * i, step=i)
        client.set_trial_system_attr(trial._trial_id, "seen", {"by": i})
        client.set_trial_user_attrs(trial._trial_id, {"status": "verified", "more": [i, None]})
        client.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.COMPLETE, [1.0])
    trials = optuna.load_study(study_name="fronts", storage=open_storage(server.url)).trials
    assert len(trials) == 4 and all(t.user_attrs["status"] == "verified" for t in trials)
    channel = grpc.insecure_channel(server.url[len("grpc://"):])
    apply = channel.unary_unary(APPLY_METHOD, request_serializer=lambda o: json.dumps(o).encode(),
                                response_deserializer=json.loads)
    with pytest.raises(grpc.RpcError) as refused:
        apply({"ops": [["no_such_operation"]]}, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as missing:
        apply({"ops": [["set_trial_system_attr", 10 ** 6, "k", "v"]]}, timeout=10)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    server.close()
    again = optuna.load_study(study_name="fronts", storage=open_storage(f"journal:{path}"))
    assert [t.state.name for t in again.trials] == ["COMPLETE"] * 4  # the core wrote the journal
    assert [vars(t) for t in trials] == [vars(t) for t in again.trials]  # and the fronts sent it as it is


def test_front_processes_serve_a_journal_only(tmp_path):
    with pytest.raises(ConfigurationError, match="--fronts 2: front processes serve a journal: URL only"):
        serve(f"sqlite:///{tmp_path / 's.db'}", "127.0.0.1", 0, fronts=2)
    with pytest.raises(ConfigurationError, match="--fronts -1"):
        serve(f"journal:{tmp_path / 's.log'}", "127.0.0.1", 0, fronts=-1)


def test_the_study_server_over_postgresql(tmp_path, study_server, postgres_url):
    import psycopg2

    # A database of its own: test_shared_study's PostgreSQL test has a study of the same name in the default one.
    connection = psycopg2.connect(postgres_url)
    connection.autocommit = True
    with connection.cursor() as cursor:
        cursor.execute("DROP DATABASE IF EXISTS study_server")
        cursor.execute("CREATE DATABASE study_server")
    connection.close()
    server = study_server(postgres_url.rsplit("/", 1)[0] + "/study_server")
    check_cooperation(tmp_path, server.url)


def test_a_trials_user_attributes_go_in_one_call(tmp_path, study_server):
    server = study_server(f"journal:{tmp_path / 'study.log'}")
    storage = open_storage(server.url)
    study = optuna.create_study(storage=storage, study_name="attrs")
    trial = study.ask()
    storage.set_trial_user_attrs(trial._trial_id, {"status": "verified", "mneme": {"hash": "abc"}})
    study.tell(trial, 1.0)
    again = optuna.load_study(study_name="attrs", storage=open_storage(f"journal:{tmp_path / 'study.log'}"))
    assert again.trials[0].user_attrs == {"status": "verified", "mneme": {"hash": "abc"}}


def test_refusals_are_one_line_with_exit_status_2(tmp_path, capsys):
    assert main(["study-server", f"sqlite:///{tmp_path / 's.db'}", "--host", "0.0.0.0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "no authentication" in err and "--insecure" in err and "Traceback" not in err
    assert main(["study-server", "redis://localhost", "--port", "0"]) == 2
    assert "give journal:PATH" in capsys.readouterr().err


def test_a_tuner_says_when_no_study_server_answers(monkeypatch):
    import tuner.strategies.shared_study as shared

    monkeypatch.setattr(shared, "GRPC_WAIT_S", 0.5)
    with pytest.raises(ConfigurationError, match="no study server answered"):
        open_storage("grpc://127.0.0.1:1")
    with pytest.raises(ConfigurationError, match="grpc://HOST:PORT"):
        open_storage("grpc://nowhere")


def test_the_study_server_decides_claims_in_one_call(tmp_path, study_server):
    from tuner.strategies.shared_study import DUPLICATE_ATTR, HASH_ATTR

    server = study_server(f"journal:{tmp_path / 'study.log'}")
    a, b = open_storage(server.url), open_storage(server.url)
    study_a = optuna.create_study(storage=a, study_name="claims")
    study_b = optuna.load_study(storage=b, study_name="claims")
    first, second, third = study_a.ask(), study_b.ask(), study_b.ask()
    sid = study_a._study_id
    assert b.claim(sid, second._trial_id, "h1") == second.number  # first to claim owns, whatever its number
    assert a.claim(sid, first._trial_id, "h1") == second.number
    assert a.get_trial(first._trial_id).system_attrs == {HASH_ATTR: "h1", DUPLICATE_ATTR: second.number}
    study_b.tell(second, state=optuna.trial.TrialState.FAIL)  # a stopped tuner: the hash is free again
    assert b.claim(sid, third._trial_id, "h1") == third.number
    # A new server over the same study takes the claims already in it.
    server.close()
    again = study_server(f"journal:{tmp_path / 'study.log'}")
    c = open_storage(again.url)
    late = optuna.load_study(storage=c, study_name="claims").ask()
    assert c.claim(sid, late._trial_id, "h1") == third.number


class CountedApply:
    """The study server's ``Apply`` calls (their operations' names), counted where the server runs (a thread
    of the test)."""

    def __init__(self, monkeypatch) -> None:
        import tuner.study_server as study_server_module

        self.calls: list[list[str]] = []
        made = study_server_module._batch_methods

        def counting(storage, claims):
            service, methods = made(storage, claims)
            apply, serialize = methods["Apply"]

            def counted(request, context):
                self.calls.append([op[0] for op in request["ops"]])
                return apply(request, context)

            methods["Apply"] = (counted, serialize)
            return service, methods

        monkeypatch.setattr(study_server_module, "_batch_methods", counting)


def counted_strategy(tmp_path, study_server, monkeypatch, name: str, seed: int) -> tuple[CountedApply, Any]:
    """A shared-study strategy on a study server whose ``Apply`` calls are counted."""
    from test_shared_study import OnePoint

    from tuner.strategies.shared_study import SharedStudyStrategy

    counted = CountedApply(monkeypatch)
    server = study_server(f"journal:{tmp_path / 'study.log'}")
    return counted, SharedStudyStrategy(OnePoint(tuple(range(64, 64 * 4097, 64))), "random", storage=server.url,
                                        study_name=name, seed=seed, enqueue_baseline=False)


def test_a_batch_of_asks_is_one_call_and_told_trials_go_with_the_next(tmp_path, study_server, monkeypatch):
    counted, strategy = counted_strategy(tmp_path, study_server, monkeypatch, "batch", 3)
    asked = strategy.ask_many(8)
    assert len(asked) == 8 and len({c.hash for c in asked}) == 8
    claims = [ops for ops in counted.calls if "claim" in ops]
    assert len(claims) == 1 and claims[0].count("claim") == 8, counted.calls
    assert claims[0].count("create_new_trial") == 8  # the trials of the next asks, made ahead
    before = len(counted.calls)
    for candidate in asked:
        strategy.tell(candidate, [float(candidate.params["block_dim_x"])])
    assert len(counted.calls) == before, "a told trial waits for the next call"
    asked = strategy.ask_many(8)  # the ends go with the claims; the trials come from those made ahead
    assert len(counted.calls) == before + 1, counted.calls[before:]
    assert counted.calls[-1].count("set_trial_state_values") == 8
    assert counted.calls[-1].count("claim") == 8
    for candidate in asked[:4]:
        strategy.tell(candidate, [1.0])
    before = len(counted.calls)
    strategy.flush()  # the loop asks nothing more for now: three asks' worth drawn ahead, their claims sent
    deadline = time.monotonic() + 10
    while not any("claim" in ops for ops in counted.calls[before:]) and time.monotonic() < deadline:  # (the call
        time.sleep(0.01)  # travels while the loop waits)
    sent = counted.calls[before:]
    # the trials of the draws beyond those made ahead, in one call with the ends; then the claims, which make two
    # asks' worth of trials for the next draws
    assert sent[0] == ["set_trial_state_values"] * 4 + ["create_new_trial"] * 16, sent
    assert len(sent) == 2 and sent[1].count("claim") == 24 and sent[1].count("create_new_trial") == 16, sent
    again = strategy.ask_many(8)  # drawn ahead, claims won: no call of its own
    assert len(again) == 8 and not {c.hash for c in again} & {c.hash for c in asked}
    assert len(strategy.ask_many(8)) == 8 and len(counted.calls) == before + 2, counted.calls[before:]
    strategy.close()  # the four untold and the twenty-four not run fail (released), and so do the trials made ahead
    trials = optuna.load_study(study_name="batch", storage=open_storage(f"journal:{tmp_path / 'study.log'}")).trials
    states = Counter(t.state.name for t in trials)
    assert states == {"COMPLETE": 12, "FAIL": 4 + 24 + 16}, states
    assert all("status" not in t.user_attrs for t in trials if t.state.name == "FAIL")


def test_no_more_is_drawn_ahead_than_the_loop_will_ask(tmp_path, study_server, monkeypatch):
    counted, strategy = counted_strategy(tmp_path, study_server, monkeypatch, "upcoming", 5)
    asked = strategy.ask_many(8)
    for candidate in asked:
        strategy.tell(candidate, [1.0])
    strategy.flush(upcoming=3)  # (a budget: three more at most)
    assert len(strategy.ask_many(3)) == 3
    strategy.flush(upcoming=0)
    strategy.close()
    trials = optuna.load_study(study_name="upcoming", storage=open_storage(f"journal:{tmp_path / 'study.log'}")).trials
    states = Counter(t.state.name for t in trials)
    # the three asked and not run, and the five left of the trials made with the first claims (before a budget was
    # told); none drawn or made beyond
    assert states == {"COMPLETE": 8, "FAIL": 3 + 5}, states
    claims = [ops.count("claim") for ops in counted.calls if "claim" in ops]
    assert claims == [8, 3], counted.calls


def test_a_kept_change_the_server_refuses_is_logged_and_the_rest_goes_on(tmp_path, study_server, caplog):
    server = study_server(f"journal:{tmp_path / 'study.log'}")
    storage = open_storage(server.url)
    storage.hold()
    study = optuna.create_study(storage=storage, study_name="refused")
    first, second = study.ask(), study.ask()
    study.tell(first, 1.0)  # kept for the next call
    other = open_storage(server.url)  # another process finishes it meanwhile
    other.set_trial_state_values(first._trial_id, optuna.trial.TrialState.FAIL)
    with caplog.at_level("WARNING", logger="mneme.tune.shared"):
        assert storage.claim_many(study._study_id, [(second._trial_id, "abc")]) == [second.number]
    assert "refused set_trial_state_values" in caplog.text
    assert other.get_trial(first._trial_id).state.name == "FAIL"


def test_the_servers_journal_is_optunas_file_locked_while_it_serves(tmp_path, study_server):
    from tuner.study_journal import ServerJournal

    path = tmp_path / "study.log"
    server = study_server(f"journal:{path}")
    study = optuna.create_study(storage=open_storage(server.url), study_name="j")
    study.optimize(lambda t: t.suggest_int("x", 0, 9), n_trials=5)
    with pytest.raises(ConfigurationError, match="locked by another process"):
        ServerJournal(path)
    server.close()
    again = optuna.load_study(study_name="j", storage=open_storage(f"journal:{path}"))  # Optuna's own reader
    assert [t.params["x"] for t in again.trials] == [t.params["x"] for t in study.trials]
    with path.open("ab") as f:
        f.write(b'{"op_code": 4, "wor')  # a crash in the middle of an append
    journal = ServerJournal(path)
    assert len(journal.read_logs(0)) == len(path.read_text().splitlines())
    assert path.read_bytes().endswith(b"\n")


def test_a_file_that_is_not_a_journal_is_refused(tmp_path):
    from tuner.study_journal import ServerJournal

    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    with pytest.raises(ConfigurationError, match="not a journal"):
        ServerJournal(path)
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert main(["study-server", f"journal:{path}", "--port", "0"]) == 2
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers  # (Ctrl-C works again)


def test_a_tuner_keeps_one_connection_to_each_front_process(tmp_path, study_server):
    """The kernel gives a new connection to any front process; a tuner's client keeps one to each, so that its
    calls spread over all of them."""
    server = study_server(f"journal:{tmp_path / 'study.log'}", fronts=4)
    storage = open_storage(server.url)
    assert storage.decides_claims()
    fronts = [storage._apply_of(channel)({"ops": [], "front": True})["front"] for channel in storage._batch_channels]
    assert sorted(fronts) == [[0, 4], [1, 4], [2, 4], [3, 4]], fronts
    storage.close()


class HeldCall:
    """An ``Apply`` future that runs the call only when its result is asked for (or when released)."""

    def __init__(self, call, request, sent: list) -> None:
        self.call, self.request = call, request
        self.before = [held for held in sent if isinstance(held, HeldCall) and not held.done()]  # held when sent
        self._result = None
        self._done = False

    def release(self) -> None:
        if not self._done:
            self._result, self._done = self.call(self.request), True

    def done(self) -> bool:
        return self._done

    def result(self, timeout=None):
        self.release()
        return self._result


class Held:
    """The client's ``Apply`` calls, the ones sent without waiting held until asked for (see ``HeldCall``)."""

    def __init__(self, storage) -> None:
        import itertools

        self.sent: list = []
        calls = [storage._apply_of(channel) for channel in storage._batch_channels]
        storage._applies = itertools.cycle([self._wrap(call) for call in calls])
        self.looks = 0
        changes = storage._changes

        def look(request):
            self.looks += 1
            return changes(request)

        storage._changes = look

    def _wrap(self, call):
        sent = self.sent

        class Wrapped:
            def __call__(self, request, **kwargs):
                sent.append(request)
                return call(request, **kwargs)

            def future(self, request):
                held = HeldCall(call, request, sent)
                sent.append(held)
                return held

        return Wrapped()


def held_study(tmp_path, study_server, name: str) -> tuple[Any, Any, Held]:
    server = study_server(f"journal:{tmp_path / 'study.log'}", fronts=2)
    storage = open_storage(server.url)
    study = optuna.create_study(storage=storage, study_name=name)
    storage.hold()
    assert storage.decides_claims()
    return storage, study, Held(storage)


def test_calls_go_without_waiting_for_each_other_and_a_trials_changes_stay_in_order(tmp_path, study_server):
    storage, study, held = held_study(tmp_path, study_server, "order")
    sid = study._study_id
    first, second, third = study.ask(), study.ask(), study.ask()
    study.tell(first, 1.0)  # (held: its end goes with the next call)
    storage.flush(study_id=sid)
    ends = held.sent[-1]
    assert isinstance(ends, HeldCall) and not ends.done()
    owners = storage.claim_many_later(sid, [(second._trial_id, "h2")])
    claim = held.sent[-1]
    assert claim.before == [ends], "the claims went without waiting for the call before"
    assert owners() == [second.number] and not ends.done()
    # A change of a trial that a call still in flight changes waits for that call's answer first.
    storage.set_trial_user_attrs(third._trial_id, {"a": 1})
    storage.flush(study_id=sid)
    attrs = held.sent[-1]
    storage.set_trial_user_attrs(third._trial_id, {"b": 2})
    storage.flush(study_id=sid)
    assert attrs.done() and attrs not in held.sent[-1].before and ends in held.sent[-1].before
    storage.flush(release=True)  # (the run is over: every call answered)
    assert all(call.done() for call in held.sent if isinstance(call, HeldCall))
    trials = optuna.load_study(study_name="order", storage=open_storage(f"journal:{tmp_path / 'study.log'}")).trials
    assert trials[first.number].state.name == "COMPLETE" and trials[first.number].values == [1.0]
    assert trials[second.number].system_attrs["mneme:hash"] == "h2"
    assert trials[third.number].user_attrs == {"a": 1, "b": 2}


def test_the_studys_news_comes_once_a_look(tmp_path, study_server):
    storage, study, held = held_study(tmp_path, study_server, "news")
    sid = study._study_id
    trials = [study.ask() for _ in range(3)]
    storage.get_all_trials(sid)  # a look
    looks = held.looks
    for trial in trials[:2]:
        study.tell(trial, 1.0)
        storage.flush(study_id=sid)
    asked = ["changes" in call.request for call in held.sent if isinstance(call, HeldCall)]
    assert asked == [True, False], asked
    # A look while the news is on its way shows the study as it was (this process's trials as it has them),
    # without a call of its own.
    other = open_storage(f"journal:{tmp_path / 'study.log'}")  # (another process, beside the server)
    assert [t.state.name for t in storage.get_all_trials(sid)] == ["COMPLETE", "COMPLETE", "RUNNING"]
    assert held.looks == looks and [t.state.name for t in other.get_all_trials(sid)] == ["RUNNING"] * 3
    for call in held.sent:
        if isinstance(call, HeldCall):
            call.release()
    assert [t.state.name for t in storage.get_all_trials(sid)] == ["COMPLETE", "COMPLETE", "RUNNING"]
    assert held.looks == looks, "the news came with the call"
    study.tell(trials[2], 1.0)
    storage.flush(study_id=sid)
    assert "changes" in held.sent[-1].request  # (the first call after a look asks again)
    storage.flush(release=True)


def test_the_others_trials_are_read_off_their_rows_until_a_trial_is_asked_for(tmp_path, study_server):
    """A tuner's look reads what it needs of the others' trials (state, values, hash, claim, status) without
    making their ``FrozenTrial``, and leaves out those made ahead that no claim tags yet; a trial asked for is
    made of its row and says what the study says."""
    from test_shared_study import OnePoint

    from tuner.strategies.shared_study import HASH_ATTR, SharedStudyStrategy

    server = study_server(f"journal:{tmp_path / 'study.log'}", fronts=2)  # (fronts answer rows)
    space = OnePoint(tuple(range(64, 64 * 4097, 64)))
    mine, other = (SharedStudyStrategy(space, "random", storage=server.url, study_name="rows", seed=seed,
                                       enqueue_baseline=False) for seed in (1, 2))
    theirs = other.ask_many(6)
    for candidate in theirs[:4]:
        other.tell(candidate, [float(candidate.params["block_dim_x"])])
    other.flush()
    other._storage.flush(release=False)
    other._storage._land()
    mine._sync()
    storage, sid = mine._storage, mine._study_id
    view = storage._known[sid]
    ahead = {made["number"] for made in other._storage._next[sid]}  # made for the other's next asks
    assert ahead and all(n >= len(view.trials) or view.trials[n] is None for n in ahead), "unclaimed trials came"
    seen = [t for t in view.trials if t is not None]
    assert len(seen) >= 6 and [type(t).__name__ for t in seen] == ["list"] * len(seen), "a look made trials"
    told = {c.hash: (float(c.params["block_dim_x"]),) for c in theirs[:4]}
    assert {key: mine._values[key] for key in told} == told
    assert {c.hash for c in theirs[4:]} <= mine._running_elsewhere
    made = storage.get_all_trials(sid, deepcopy=False)  # (by number, up to the first not seen)
    assert made and all(type(t) is optuna.trial.FrozenTrial for t in made)
    study = optuna.load_study(study_name="rows", storage=open_storage(f"journal:{tmp_path / 'study.log'}"))
    for trial, reread in zip(made, study.get_trials(deepcopy=False)):
        assert (trial.number, trial.state, trial.values, trial.params, trial.distributions) == \
            (reread.number, reread.state, reread.values, reread.params, reread.distributions)
        assert trial.system_attrs.get(HASH_ATTR) == reread.system_attrs.get(HASH_ATTR)
    mine.close()
    other.close()
