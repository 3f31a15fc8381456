"""``mneme study-server``: Optuna's storage proxy in front of a journal file, SQLite or PostgreSQL, with
tuner processes on ``--optuna-storage grpc://HOST:PORT`` (loopback only)."""

from __future__ import annotations

import threading

import optuna
import pytest
from test_shared_study import check_cooperation

from mneme.cli import main
from mneme.errors import ConfigurationError
from tuner.strategies.shared_study import open_storage
from tuner.study_server import serve


class StudyServer:
    """``tuner.study_server.serve`` in a thread of the test, on a free loopback port."""

    def __init__(self, url: str) -> None:
        self.stop = threading.Event()
        lines: list[str] = []
        announced = threading.Event()

        def announce(line: str) -> None:
            lines.append(line)
            announced.set()

        self.thread = threading.Thread(target=serve, args=(url, "127.0.0.1", 0),
                                       kwargs={"announce": announce, "stop": self.stop}, daemon=True)
        self.thread.start()
        assert announced.wait(30), "the study server did not start"
        self.url = lines[0].rsplit("--optuna-storage ", 1)[1].rstrip(")")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


@pytest.fixture
def study_server(request, tmp_path):
    servers = []

    def start(url: str) -> StudyServer:
        servers.append(StudyServer(url))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.mark.parametrize("backend", ["journal", "sqlite"])
def test_two_processes_share_a_study_through_the_study_server(tmp_path, study_server, backend):
    url = f"journal:{tmp_path / 'study.log'}" if backend == "journal" else f"sqlite:///{tmp_path / 'study.db'}"
    server = study_server(url)
    assert server.url.startswith("grpc://127.0.0.1:")
    check_cooperation(tmp_path, server.url)  # no configuration twice, user attributes, the merged report


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
