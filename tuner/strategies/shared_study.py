"""Shared Optuna studies: several ``mneme tune`` processes cooperating on one search.

Optuna's distributed optimization is processes that ask and tell trials of one
study held in a storage every process reaches: SQLite on one node, PostgreSQL
(or MySQL) across nodes, or Optuna's journal storage (an append-only file) on a
shared filesystem; or ``grpc://HOST:PORT``, Optuna's storage proxy in front of one
of those databases (``mneme study-server``, ``tuner/study_server.py``), the way
to many tuners on one study. :func:`open_storage` turns ``--optuna-storage``
into that storage; :class:`SharedStudyStrategy` samples through it and adds what a tuner
needs on top:

* **A configuration is replayed once in the whole study.** Two trials whose
  parameters derive the same configuration (same grounded hash) are duplicates.
  Every trial is tagged with its hash (system attribute ``mneme:hash``) right
  after it is asked; the trial that evaluates a hash is its *claim*: the
  lowest-numbered trial tagged with it that is not itself a duplicate and was
  not released (a ``FAIL`` without a ``status``: its process stopped). A process decides only after every lower-numbered running trial is
  tagged (a trial is tagged microseconds after it is created; after
  ``TAG_WAIT_S`` an untagged one is taken as abandoned), so two processes can
  never both own one hash: the higher-numbered trial always sees the lower
  one's tag. An enqueued trial (the baseline, an unseen point) is tagged in the write that enqueues
  it, so while it waits (WAITING) it is already a claim. Through a study server, the server decides
  every trial's claim, an enqueued one's when a process takes it. A duplicate is told its claim's
  outcome once it is in the study
  (its values, or ``FAIL`` for a configuration that failed: the claim's own
  state is ``FAIL`` with its ``status``); ``mneme:duplicate_of`` names the claim.
* **Results are readable where Optuna's tools read them.** Each evaluated trial
  carries user attributes ``status``, ``speedup``, ``configuration`` and ``mneme``
  (``metric``, ``hash``, ``error``, ``worker`` host:pid, ``results_dir``), so
  ``optuna-dashboard STORAGE`` shows them beside the parameters and values.
* **Ctrl-C leaves the study clean.** :meth:`SharedStudyStrategy.close` fails the
  process's trials still running, which releases their claims: another process
  (or this one after ``--resume``) can take those configurations.

A process killed outright (SIGKILL) leaves its running trials' claims held;
their duplicates wait, and ``mneme tune report --optuna-storage`` lists them as
running.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

from mneme.errors import ConfigurationError
from tuner.space.search_space import Candidate, SearchSpace
from tuner.strategies.sample_strategy import DUPLICATE_ATTR, FAILED, PRUNED, OptunaSamplingStrategy, _Draws, tell

log = logging.getLogger("mneme.tune.shared")

HASH_ATTR = "mneme:hash"
#: Connections a tuner's client opens for its ``Apply`` calls to a study server (they take turns), where the
#: server does not say which of its front processes a connection reached.
BATCH_CONNECTIONS = 4
#: Connections a tuner's client tries, a front process each, to reach every front of a study server once.
SPREAD_TRIES = 16
#: The user attributes a tuner reads of the study's trials (the others' results stay in the study).
READ_USER_ATTRS = ("status",)
#: Asks' worth of candidates a tuner on a study server keeps drawn ahead, their claims won or on their way
#: (an ask's worth: the most one ask took so far).
AHEAD_ASKS = 3
#: Claim calls a tuner on a study server keeps on their way at once.
CLAIMS_IN_FLIGHT = 2
#: Seconds between a tuner's looks at the study when it draws ahead (a look costs the trials changed since the
#: last: the fewer looks, the fewer versions of each trial it reads). An ask that what was drawn ahead does not
#: cover, and a claim lost to another process, look at once.
LOOK_INTERVAL_S = 0.5
__all__ = ["DUPLICATE_ATTR", "HASH_ATTR", "SharedStudyStrategy", "open_storage"]
#: How long a process waits for a lower-numbered running trial to be tagged before taking it as abandoned.
TAG_WAIT_S = 10.0
SCHEMA_ATTEMPTS = 5
STORAGE_FORMS = "grpc://HOST:PORT (mneme study-server), sqlite:///PATH, postgresql://USER@HOST/DB, mysql://..., or journal:PATH"
#: Seconds a tuner waits for the study server of ``grpc://HOST:PORT`` to answer.
GRPC_WAIT_S = 60.0


def open_storage(url: str) -> Any:
    """The Optuna storage of ``--optuna-storage URL``.

    ``journal:PATH`` is Optuna's JournalStorage over a file (locks that work on
    NFS and Lustre); an RDB URL is an RDBStorage, SQLite with a long lock
    timeout so that processes queue instead of failing with "database is locked".
    """
    import optuna

    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"--optuna-storage {url!r}: give {STORAGE_FORMS}")
    if url.startswith("journal:"):

        path = Path(url[len("journal:"):]).expanduser()
        if not str(path) or not path.parent.is_dir():
            raise ConfigurationError(f"--optuna-storage {url}: the directory {path.parent} does not exist; "
                                     "create it (on a filesystem every tuner reaches)")
        return _journal_storage(str(path))
    if url.startswith("grpc://"):
        return _grpc_storage(url, GRPC_WAIT_S)
    scheme = url.split(":", 1)[0].split("+", 1)[0]
    if scheme == "sqlite":
        engine = {"connect_args": {"timeout": 120}}
    elif scheme in ("postgresql", "postgres", "mysql"):
        engine = {"pool_pre_ping": True}
        url = _with_postgres_driver(url)
    else:
        raise ConfigurationError(f"--optuna-storage {url!r}: unknown storage; give {STORAGE_FORMS}")
    import sqlalchemy.exc

    for attempt in range(SCHEMA_ATTEMPTS):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine)
        except ImportError as exc:
            raise ConfigurationError(f"--optuna-storage {url}: the database driver is missing ({exc}); "
                                     "install psycopg2-binary (PostgreSQL) or PyMySQL (MySQL)") from None
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError):
            # Processes starting together race to create a new database's tables; the losers see them next time.
            if attempt == SCHEMA_ATTEMPTS - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


#: mneme's additions to Optuna's storage service on ``mneme study-server`` (tuner/study_server.py):
#: ``Apply`` runs a list of one process's changes of its own trials in one round trip (JSON), the claim of a
#: configuration hash among them (decided by the server: no waiting for other processes' trials to be
#: tagged); ``Changes`` returns the trials changed since a cursor (not every unfinished trial each time).
APPLY_METHOD = "/mneme.study.v1.StudyBatch/Apply"
CHANGES_METHOD = "/mneme.study.v1.StudyBatch/Changes"
#: The interpreter's thread switch interval in a tuner on a study server (see ``_grpc_storage``).
SWITCH_INTERVAL_S = 0.0002


def _grpc_storage(url: str, timeout: float) -> Any:
    """The storage client of ``grpc://HOST:PORT``, once its server answers: Optuna's ``GrpcStorageProxy``
    with fewer round trips per trial and less in each, where the server is a ``mneme study-server``:

    * this process's changes of its own trials (parameters, attributes and, once ``hold`` was called, the
      ends of trials it told) wait in a list and go first with the next call, in one ``Apply``;
      ``get_trial`` of its own trials is answered from a copy kept here;
    * ``claim_many`` decides a batch of claims in one call, which also makes as many trials for the next
      asks (``create_new_trial`` takes those first): a batch of trials costs one call;
    * ``get_all_trials`` fetches only the trials changed since the last look (``Changes``), and answers the
      query for WAITING trials that ``Study.ask`` makes from what it has (a trial mneme enqueues, the
      baseline or an unseen point, is asked for after the next look); ``look`` says what changed since it
      was last asked, read off the answer's rows: a trial's ``FrozenTrial`` is made only when it is asked for;
    * the first call that claims, makes or ends trials after a look brings the study's changes back with
      it, and the next ``get_all_trials`` answers from them without a call of its own (a second one in a row
      asks the server): a look shows the study's trials as they were at that call, and a trial that changed
      several times between two looks comes once. The list of the study's trials is kept up to date in place,
      so a look costs the changes, not the study's size.

    Against a plain Optuna proxy (``UNIMPLEMENTED``) it is Optuna's client.
    """
    import base64
    import copy
    import datetime
    import functools
    import itertools
    import json
    import threading
    import warnings

    import grpc
    import optuna
    from optuna.distributions import distribution_to_json
    from optuna.trial import FrozenTrial, TrialState

    from tuner.strategies.study_rows import outline, rows_of, state_of, trial_of

    host, sep, port = url[len("grpc://"):].rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigurationError(f"--optuna-storage {url}: give grpc://HOST:PORT of a `mneme study-server`")

    def _changed_trials(data: bytes) -> tuple[dict, list[Any]]:
        size = int.from_bytes(data[:4], "big")
        head = json.loads(data[4:4 + size])
        if head.get("form") == "json":
            return head, rows_of(json.loads(data[4 + size:]))
        return head, _trials_of(data[4 + size:])

    def _encode(o: Any) -> bytes:
        return json.dumps(o).encode()

    from optuna.distributions import json_to_distribution
    from optuna.storages._grpc.auto_generated import api_pb2
    from optuna.storages._grpc.servicer import _from_proto_trial_state

    distribution_of = functools.lru_cache(maxsize=1024)(json_to_distribution)  # a study has few distinct ones

    def _from_proto(trial: Any) -> Any:
        """Optuna's ``_from_proto_trial`` at a third of the cost: the dates through ``fromisoformat`` (the
        server writes ``%Y-%m-%d %H:%M:%S.%f``), each distinct distribution parsed once (the JSON form,
        ``tuner.strategies.study_rows``, costs a fifth of this)."""
        distributions = {key: distribution_of(value) for key, value in trial.distributions.items()}
        return FrozenTrial(
            number=trial.number, state=_from_proto_trial_state(trial.state), value=None,
            values=list(trial.values) if trial.values else None,
            datetime_start=datetime.datetime.fromisoformat(trial.datetime_start) if trial.datetime_start else None,
            datetime_complete=(datetime.datetime.fromisoformat(trial.datetime_complete)
                               if trial.datetime_complete else None),
            params={key: distributions[key].to_external_repr(value) for key, value in trial.params.items()},
            distributions=distributions,
            user_attrs={key: json.loads(value) for key, value in trial.user_attributes.items()},
            system_attrs={key: json.loads(value) for key, value in trial.system_attributes.items()},
            intermediate_values=dict(trial.intermediate_values), trial_id=trial.trial_id)

    def _trials_of(reply: bytes) -> list[Any]:
        return [_from_proto(t) for t in api_pb2.GetTrialsReply.FromString(reply).trials]

    def _refusal(exc: Any) -> BaseException:
        """The exception Optuna's storage raises for a refused ``Apply`` call."""
        code = exc.code()
        if code == grpc.StatusCode.NOT_FOUND:
            return KeyError(exc.details())
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            return optuna.exceptions.UpdateFinishedTrialError(exc.details())
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return ValueError(exc.details())
        return exc

    class _View:
        """A study's trials as this process knows them: by number (None: not seen yet; a row of
        ``tuner.strategies.study_rows`` until its ``FrozenTrial`` is asked for), the server's cursor and
        generation, the numbers of the WAITING ones, how many are not seen yet."""

        def __init__(self, generation: str) -> None:
            self.trials: list[Any] = []
            self.cursor = 0
            self.generation = generation
            self.waiting: set[int] = set()
            self.holes = 0
            self.touched: set[int] | None = None  # numbers changed since the last ``look`` (None: all)

        def seen(self) -> int:
            """How many trials are seen, by number from 0 (up to the first not seen yet)."""
            return len(self.trials) if not self.holes else self.trials.index(None)

        def trial(self, number: int) -> Any:
            """The ``FrozenTrial`` of trial ``number`` (made of its row the first time)."""
            entry = self.trials[number]
            if type(entry) is list:
                entry = self.trials[number] = trial_of(entry)
            return entry

    def _found(view: _View, states: Any, deepcopy: bool) -> list[Any]:
        """The view's trials (of ``states``): by number, up to the first not seen yet (the rest come next time)."""
        trials = view.trials
        if states is None:
            found = [view.trial(n) for n in range(view.seen())]
        else:
            found = [view.trial(n) for n, t in enumerate(trials) if t is not None and state_of(t) in states]
        return copy.deepcopy(found) if deepcopy else found

    def _copy_trial(trial: Any) -> Any:
        """A copy of ``trial`` whose dictionaries the caller may change (values are not copied: cheaper
        than ``copy.deepcopy``, which this is asked for a few times a trial)."""
        copied = copy.copy(trial)
        copied.params, copied.distributions = dict(trial.params), dict(trial.distributions)
        copied.user_attrs, copied.system_attrs = dict(trial.user_attrs), dict(trial.system_attrs)
        copied.intermediate_values = dict(trial.intermediate_values)
        if trial.values is not None:
            copied.values = list(trial.values)
        return copied

    class _Call:
        """An ``Apply`` sent without waiting: its future, the kept changes it took, the study whose news it could
        ask for and whether it did, the trials it changes, what makes its own operations' results into what its
        sender reads (None: they are read as they are); once its answer is taken in, those results or the
        refusal."""

        def __init__(self, future: Any, queued: list[list[Any]], study_id: int | None, asked: bool,
                     trials: set[int], finish: Callable[[list[Any]], Any] | None) -> None:
            self.future, self.queued, self.study_id, self.asked = future, queued, study_id, asked
            self.trials, self.finish = trials, finish
            self.taken = False
            self.results: Any = None
            self.error: BaseException | None = None

        def wait(self) -> None:
            """Until the server has answered (the answer is taken in elsewhere)."""
            try:
                self.future.result()
            except grpc.RpcError:
                pass  # (whoever takes the answer in raises it)

    class StudyServerClient(optuna.storages.GrpcStorageProxy):
        def _setup(self) -> None:
            super()._setup()
            # ``Apply`` calls take turns over connections of their own: a study server's front processes
            # (``SO_REUSEPORT``) each take the connections the kernel gives them, so a tuner's batches spread over
            # them instead of all going to the front its one connection landed on (``_spread`` keeps one to each
            # front, where the server says which answered). Calls do not wait for each other; a trial's changes
            # keep their order (``_request``).
            self._batch_channels = [self._batch_channel() for _ in range(BATCH_CONNECTIONS)]
            self._applies = itertools.cycle([self._apply_of(channel) for channel in self._batch_channels])
            self._changes = self._channel.unary_unary(CHANGES_METHOD, request_serializer=_encode,
                                                      response_deserializer=_changed_trials)
            self._known: dict[int, _View] = {}  # study id -> its trials as this process knows them
            self._fresh: set[int] = set()  # studies whose changes came with a call since the last look
            self._asked: set[int] = set()  # studies whose changes a call since the last look asked for
            self._own: dict[int, Any] = {}  # trial id -> this process's copy of its running trial
            self._study_of: dict[int, int] = {}  # trial id -> study id, of this process's running trials
            self._queue: list[list[Any]] = []  # this process's changes of its trials not sent yet, in order
            self._unsent: dict[int, Any] = {}  # trial id -> this process's trial finished here, its end not sent
            self._next: dict[int, list[dict]] = {}  # study id -> trials made ahead (with claims) for the next asks
            self._holding = False  # whether trial ends wait for the next call (``hold``)
            self._lock = threading.RLock()
            self._mneme = True  # False: a plain Optuna proxy
            self._checked = False  # whether the server was asked if it is a mneme study server
            self._user_attrs: list[str] | None = None  # the user attributes read of the study (None: all)
            self._unclaimed = True  # whether the looks show running trials no claim tags (``skip_unclaimed``)
            self._wanted: dict[int, int] = {}  # study id -> the most trials a batch asked for (``reserve``)
            self._flying: list[_Call] = []  # ``Apply`` calls sent without waiting for their answers, in order

        def _batch_channel(self) -> Any:
            """A connection of its own (not shared with the other channels to the server)."""
            return grpc.insecure_channel(f"{self._host}:{self._port}", options=[
                ("grpc.max_receive_message_length", -1), ("grpc.use_local_subchannel_pool", 1)])

        @staticmethod
        def _apply_of(channel: Any) -> Any:
            return channel.unary_unary(APPLY_METHOD, request_serializer=_encode, response_deserializer=json.loads)

        def _spread(self, first: dict[str, Any]) -> None:
            """Keep one connection to each front process of the server, where it says which one a connection
            reached (``first``: the answer to the first probe, over the first connection): the kernel gives a
            new connection to any of them, so a tuner's connections could all land on one while the others idle.
            Up to ``SPREAD_TRIES`` connections a front are tried; the calls take turns over those kept."""
            where = first.get("front")
            if not (isinstance(where, list) and len(where) == 2 and all(isinstance(n, int) for n in where)):
                return  # (a server without fronts, or one that does not say: the connections stay as they are)
            count = max(1, where[1])
            kept = {where[0]: self._batch_channels[0]}
            tried = [*self._batch_channels[1:]]
            attempts = 0
            while len(kept) < count and attempts < SPREAD_TRIES * count:
                channel = tried.pop() if tried else self._batch_channel()
                attempts += 1
                try:
                    answer = self._apply_of(channel)({"ops": [], "front": True}, timeout=GRPC_WAIT_S)
                except grpc.RpcError:
                    answer = {}
                front = answer.get("front") if isinstance(answer, dict) else None
                index = front[0] if isinstance(front, list) and front else None
                if isinstance(index, int) and index not in kept:
                    kept[index] = channel
                else:
                    channel.close()
            for channel in tried:
                channel.close()
            self._batch_channels = [kept[index] for index in sorted(kept)]
            self._applies = itertools.cycle([self._apply_of(channel) for channel in self._batch_channels])

        # -- sending ---------------------------------------------------------------------------
        def _send(self, ops: list[list[Any]], study_id: int | None = None) -> list[Any]:
            """Run the changes kept so far, then ``ops``, on the server in one call; the results of ``ops``.
            With ``study_id`` (a study looked at before), its changes come back with the answer. A kept change
            the server refuses (a trial finished meanwhile) is logged; a refused one of ``ops`` raises."""
            self._land(wait=False)
            request, queued, _ = self._request(ops, study_id)
            try:
                reply = next(self._applies)(request)
            except grpc.RpcError as exc:
                self._sent(queued)
                raise _refusal(exc) from None
            return self._received(reply, queued, study_id)

        def _later_call(self, ops: list[list[Any]], study_id: int | None,
                        finish: Callable[[list[Any]], Any] | None = None) -> _Call:
            """Send the changes kept so far, then ``ops``, without waiting for the answer (see :class:`_Call`)."""
            request, queued, trials = self._request(ops, study_id)
            call = _Call(next(self._applies).future(request), queued, study_id, "changes" in request, trials, finish)
            self._flying.append(call)
            return call

        def _take(self, call: _Call) -> None:
            """Take in a call's answer (once): its kept changes' refusals logged, its news merged, its results."""
            if call.taken:
                return
            call.taken = True
            if call in self._flying:
                self._flying.remove(call)
            try:
                reply = call.future.result()
            except grpc.RpcError as exc:
                self._sent(call.queued)
                call.error = _refusal(exc)
                return
            results = self._received(reply, call.queued, call.study_id)
            call.results = results if call.finish is None else call.finish(results)

        def _request(self, ops: list[list[Any]],
                     study_id: int | None) -> tuple[dict[str, Any], list[list[Any]], set[int]]:
            """(the ``Apply`` request of the changes kept so far and ``ops``, the kept changes it takes, the trials
            it changes). Calls go without waiting for each other, over connections to several front processes,
            so the server may run them in any order; a change of a trial that a call still in flight changes
            waits for that call's answer first (a trial's changes stay in order)."""
            queued, self._queue = self._queue, []
            ops = queued + ops
            trials = {op[2] if op[0] == "claim" else op[1] for op in ops if op[0] != "create_new_trial"}
            for call in self._flying:
                if not call.future.done() and not call.trials.isdisjoint(trials):
                    call.wait()
            request: dict[str, Any] = {"ops": ops, "tolerate": len(queued)}
            view = self._known.get(study_id) if study_id is not None else None
            if view is not None and study_id not in self._asked:  # (one call's worth of news a look: a trial
                # that changed several times between two looks is sent once)
                request["changes"] = self._look(study_id, view.cursor, view.generation)
                self._asked.add(study_id)
            return request, queued, trials

        def _sent(self, queued: list[list[Any]]) -> None:
            for op in queued:
                if op[0] == "set_trial_state_values":
                    self._unsent.pop(op[1], None)

        def _received(self, reply: dict[str, Any], queued: list[list[Any]], study_id: int | None) -> list[Any]:
            """The results of a request's own operations (the kept ones' refusals logged, the news merged)."""
            self._sent(queued)
            results = reply["results"]
            for op, result in zip(queued, results):
                if isinstance(result, dict) and "error" in result:
                    log.warning("the study server refused %s of trial id %s: %s", op[0], op[1], result["error"])
            changes = reply.get("changes")
            if study_id in self._known and changes is not None:  # (a server before changes came with Apply: none)
                self._merge(study_id, changes, rows_of(changes["trials"])
                            if changes.get("form") == "json" else _trials_of(base64.b64decode(changes["trials"])))
                self._fresh.add(study_id)
            return results[len(queued):]

        def close(self) -> None:
            try:
                with self._lock:
                    self._land()
            except Exception as exc:  # noqa: BLE001 - the server went away: say so
                log.warning("the study server did not answer the last changes sent to it: %s", exc)
            super().close()
            for channel in self._batch_channels:
                channel.close()

        def _look(self, study_id: int, since: int, generation: str) -> dict[str, Any]:
            """A ``Changes`` request (with the user attributes this process reads, where it said)."""
            look: dict[str, Any] = {"study_id": study_id, "since": since, "generation": generation, "form": "json"}
            if self._user_attrs is not None:
                look["user_attrs"] = self._user_attrs
            if not self._unclaimed:
                look["unclaimed"] = False
            return look

        def read_user_attrs(self, names: Any) -> None:
            """Read only these user attributes of the study's trials (the others' results are not decoded
            here; a server that does not know the request sends them all)."""
            self._user_attrs = list(names)

        def reserve(self, study_id: int, count: int) -> None:
            """Make the trials of the next ``count`` asks in one call (with what is kept, and the study's news
            where it was looked at before), unless they are made already; held only (see :meth:`hold`)."""
            with self._lock:
                if not self._holding or not self._mneme or not self._supported():
                    return
                # (what a claim makes ahead: the most a batch asked for, so that the next batch's trials come with
                # the claims of this one)
                self._wanted[study_id] = max(count, self._wanted.get(study_id, 0))
                ahead = self._next.setdefault(study_id, [])
                missing = count - len(ahead)
                if missing > 0:
                    ahead.extend(self._send([["create_new_trial", study_id]] * missing, study_id))

        def hold(self) -> None:
            """From now on the end of this process's trial waits for its next call, and a claim makes the
            trial of the next ask: the caller promises :meth:`flush` when it asks nothing more for now, and
            ``flush(release=True)`` at the end."""
            self._holding = True

        def flush(self, release: bool = False, study_id: int | None = None) -> None:
            """Send the changes kept so far (the ends of trials told since the last call among them) without
            waiting for the answer (a later call takes it in), and with ``study_id`` (a study looked at before)
            the study's news comes back with it for the next look. ``release``: also fail the trials made ahead
            for asks that did not come, and wait for every call (the run is over).
            """
            with self._lock:
                if release:
                    self._land()
                    for made in [m for ahead in self._next.values() for m in ahead]:
                        self._queue.append(["set_trial_state_values", made["trial_id"], TrialState.FAIL.name, None])
                    self._next.clear()
                    if self._queue and self._mneme:
                        self._send([])
                    return
                self._land(wait=False)
                if self._queue and self._mneme:
                    self._later_call([], study_id)

        def _land(self, wait: bool = True) -> None:
            """Take in the answers of the calls sent without waiting (see :meth:`_take`), in the order they went:
            every one (``wait``), or those in so far. The refusal of a whole call (the server went away) raises
            here, but a claim call's raises where its owners are asked for (``claim_many_later``)."""
            while self._flying:
                call = self._flying[0]
                if not (wait or call.future.done()):
                    break
                self._take(call)
                if call.error is not None and call.finish is None:
                    raise call.error

        def _flushed(self) -> None:
            """Before a call of Optuna's own client: what is kept goes first, and what was sent is answered (the
            order of changes holds)."""
            if self._queue:
                self._send([])
            self._land()

        def _supported(self) -> bool:
            """Whether the server is a mneme study server (asked once)."""
            if self._mneme and not self._checked:
                try:
                    first = self._apply_of(self._batch_channels[0])({"ops": [], "front": True})
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                        raise
                    self._mneme = False
                else:
                    self._spread(first)
                self._checked = True
            return self._mneme

        # -- this process's trials -------------------------------------------------------------
        def create_new_trial(self, study_id: int, template_trial: Any = None) -> int:
            if template_trial is not None or not self._mneme:
                return super().create_new_trial(study_id, template_trial)
            with self._lock:
                if not self._supported():
                    return super().create_new_trial(study_id, template_trial)
                ahead = self._next.get(study_id)
                made = ahead.pop(0) if ahead else None
                if made is None:
                    made = self._send([["create_new_trial", study_id]])[0]
                self._study_of[made["trial_id"]] = study_id
                start = datetime.datetime.fromisoformat(made["datetime_start"])
                self._own[made["trial_id"]] = FrozenTrial(
                    number=made["number"], state=TrialState.RUNNING, value=None, values=None,
                    datetime_start=start, datetime_complete=None, params={}, distributions={}, user_attrs={},
                    system_attrs={}, intermediate_values={}, trial_id=made["trial_id"])
                return made["trial_id"]

        def _later(self, trial_id: int, op: list[Any]) -> Any:
            """Keep ``op`` of this process's trial (running, or finished here and its end not sent) for the
            next call; its copy here, or None (not one of them: the caller sends it through Optuna's client,
            after what is kept)."""
            trial = self._own.get(trial_id) or self._unsent.get(trial_id)
            if trial is None:
                self._flushed()
                return None
            self._queue.append(op)
            return trial

        def set_trial_param(self, trial_id: int, param_name: str, param_value_internal: float,
                            distribution: Any) -> None:
            with self._lock:
                trial = self._later(trial_id, ["set_trial_param", trial_id, param_name, param_value_internal,
                                               distribution_to_json(distribution)])
                if trial is not None:
                    trial.distributions = {**trial.distributions, param_name: distribution}
                    trial.params = {**trial.params, param_name: distribution.to_external_repr(param_value_internal)}
                    return
            super().set_trial_param(trial_id, param_name, param_value_internal, distribution)

        def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
            with self._lock:
                trial = self._later(trial_id, ["set_trial_system_attr", trial_id, key, value])
                if trial is not None:
                    trial.system_attrs[key] = value
                    return
            super().set_trial_system_attr(trial_id, key, value)

        def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
            self.set_trial_user_attrs(trial_id, {key: value})

        def set_trial_user_attrs(self, trial_id: int, attrs: dict[str, Any]) -> None:
            """``set_trial_user_attr`` of each of ``attrs``, with the trial's next call."""
            with self._lock:
                trial = self._later(trial_id, ["set_trial_user_attrs", trial_id, attrs])
                if trial is not None:
                    trial.user_attrs.update(attrs)
                    return
            for name, value in attrs.items():
                super().set_trial_user_attr(trial_id, name, value)

        def set_trial_state_values(self, trial_id: int, state: Any, values: Any = None) -> bool:
            """Held (see :meth:`hold`), the end of this process's trial waits for the next call (the next
            claim, or the loop's ``flush`` when it asks nothing more for now): a batch of results costs no
            call of its own."""
            with self._lock:
                trial = self._own.get(trial_id)
                if trial is None:
                    self._flushed()
                    return super().set_trial_state_values(trial_id, state, values)
                op = ["set_trial_state_values", trial_id, state.name, None if values is None else list(values)]
                held = self._holding and state.is_finished()
                if held:
                    self._queue.append(op)
                    changed = True
                else:
                    changed = bool(self._send([op], self._study_of.get(trial_id) if state.is_finished() else None)[0])
                if changed:
                    trial.state = state
                    trial.values = None if values is None else list(values)
                    if state.is_finished():
                        trial.datetime_complete = datetime.datetime.now()
                if state.is_finished():
                    del self._own[trial_id]
                    self._study_of.pop(trial_id, None)
                    self._finished[trial_id] = trial
                    if held:
                        self._unsent[trial_id] = trial
                return changed

        def get_trial(self, trial_id: int) -> Any:
            with self._lock:
                trial = self._own.get(trial_id) or self._finished.pop(trial_id, None) or self._unsent.get(trial_id)
                if trial is not None:
                    return _copy_trial(trial)
            return super().get_trial(trial_id)

        def claim(self, study_id: int, trial_id: int, key: str) -> int | None:
            """Tag the trial with ``key`` and have the server decide who evaluates it (with the trial's changes
            kept so far): the number of the trial that owns ``key`` (this one, or another process's), or None
            against a plain Optuna proxy (the caller tags and decides itself)."""
            with self._lock:
                if not self._mneme or not self._supported():
                    return None
                # Any trial of the study, this process's new ones and the WAITING ones it took (the baseline,
                # an enqueued point): a claim decided here and one decided by the server would disagree.
                # The call also makes the trial of the next ask (a trial costs one call).
                return self._claim_all(study_id, [(trial_id, key)])[0]

        def decides_claims(self) -> bool:
            """Whether the server decides claims (a mneme study server): ``claim_many`` then works."""
            with self._lock:
                return self._mneme and self._supported()

        def claim_many(self, study_id: int, claims: list[tuple[int, str]]) -> list[int]:
            """:meth:`claim` of each (trial id, hash) in one call (in order: the first of two with one hash
            owns it, unless another process's trial does); the owners' numbers."""
            with self._lock:
                return self._claim_all(study_id, claims)

        def claim_many_later(self, study_id: int, claims: list[tuple[int, str]],
                             ahead: int | None = None) -> Callable[[], list[int]]:
            """:meth:`claim_many` without waiting for the server: the call goes now (with the changes kept so
            far); the function returned waits for its answer and gives the owners' numbers (call it once, before
            the next claim; its ``done()`` says whether the answer is in). ``ahead``: the most trials the call
            makes for the asks after these (None: as many as a batch asked for)."""
            with self._lock:
                self._land(wait=False)
                ops, made = self._claim_ops(study_id, claims, ahead)
                call = self._later_call(ops, study_id, lambda results: self._claimed(study_id, claims, made, results))

            def owners() -> list[int]:
                call.wait()  # (outside the lock)
                with self._lock:
                    self._take(call)
                if call.error is not None:
                    raise call.error
                return call.results

            owners.done = call.future.done  # type: ignore[attr-defined]
            return owners

        def _claim_ops(self, study_id: int, claims: list[tuple[int, str]],
                       limit: int | None = None) -> tuple[list[list[Any]], int]:
            """(the operations of ``claims``, and of the trials made ahead with them; how many are made ahead)."""
            # Held (see ``hold``), the call also makes the trials of the next asks (as many as a batch asked for at
            # most, or as it claims, and no more than ``limit``): a batch of trials costs one call.
            made = len(self._next.get(study_id, ()))
            wanted = max(len(claims), self._wanted.get(study_id, 0))
            if limit is not None:
                wanted = min(wanted, limit)
            ahead = wanted - made if self._holding and made < wanted else 0
            return [*(["claim", study_id, t, key] for t, key in claims), *[["create_new_trial", study_id]] * ahead], ahead

        def _claimed(self, study_id: int, claims: list[tuple[int, str]], ahead: int, results: list[Any]) -> list[int]:
            owners = [int(owner) for owner in results[:len(claims)]]
            if ahead:
                self._next.setdefault(study_id, []).extend(results[len(claims):])
            for (trial_id, key), owner in zip(claims, owners):
                trial = self._own.get(trial_id)
                if trial is not None:
                    trial.system_attrs[HASH_ATTR] = key
                    if owner != trial.number:
                        trial.system_attrs[DUPLICATE_ATTR] = owner
            return owners

        def _claim_all(self, study_id: int, claims: list[tuple[int, str]]) -> list[int]:
            ops, ahead = self._claim_ops(study_id, claims)
            return self._claimed(study_id, claims, ahead, self._send(ops, study_id))

        # -- the study -------------------------------------------------------------------------
        def look(self, study_id: int) -> list[tuple]:
            """The study's trials as ``get_all_trials`` fetches them, read without making their ``FrozenTrial``:
            the outlines of those changed since the last ``look`` (every one seen, at the first), by number, an
            outline being ``(number, state, values or None, system attributes, user attributes)``
            (``tuner.strategies.study_rows.outline``; not to be changed)."""
            with self._lock:
                view = self._refresh(study_id)
                trials = view.trials
                touched, view.touched = view.touched, set()
                numbers = range(len(trials)) if touched is None else sorted(touched)
                return [outline(trials[n]) for n in numbers if trials[n] is not None]

        def skip_unclaimed(self) -> None:
            """Leave out of the looks the others' running trials that no claim tags yet (their trials made ahead
            for their next asks: nothing in them is read); each comes once it changes again. ``get_all_trials``
            shows the trials by number up to the first not seen, as before."""
            self._unclaimed = False

        def get_all_trials(self, study_id: int, deepcopy: bool = True, states: Any = None) -> list[Any]:
            """The study's trials (this process's own as it has them): only those changed since the last
            look are fetched, or none where the last call brought them; the WAITING trials ``Study.ask``
            looks for come from what was fetched last."""
            with self._lock:
                view = self._known.get(study_id)
                if states is not None and tuple(states) == (TrialState.WAITING,) and view is not None:
                    return [view.trial(n) for n in sorted(view.waiting)]
                if not self._mneme or not self._supported():
                    return super().get_all_trials(study_id, deepcopy=deepcopy, states=states)
                return _found(self._refresh(study_id), states, deepcopy)

        def _refresh(self, study_id: int) -> _View:
            """The view of the study after a look: the changes a call brought since the last look, or those the
            server has (unless a call on its way brings them: the next look takes them in)."""
            self._land(wait=False)
            view = self._known.get(study_id)
            if view is not None and study_id not in self._fresh and any(
                    call.asked and call.study_id == study_id for call in self._flying):
                return view
            if view is None or study_id not in self._fresh:
                since, generation = (view.cursor, view.generation) if view is not None else (0, "")
                try:
                    head, changed = self._changes(self._look(study_id, since, generation))
                except grpc.RpcError as exc:
                    if exc.code() == grpc.StatusCode.NOT_FOUND:
                        raise KeyError(exc.details()) from None
                    raise
                view = self._merge(study_id, head, changed)
            self._fresh.discard(study_id)
            self._asked.discard(study_id)
            return view

        def _merge(self, study_id: int, head: dict, changed: list[Any]) -> _View:
            """Take the trials that changed (and where the server is another, everything) into the view."""
            view = self._known.get(study_id)
            if view is None or head["generation"] != view.generation:  # a first look, or a new server
                view = self._known[study_id] = _View(head["generation"])
            elif head["cursor"] < view.cursor:  # an answer overtaken by a later one (a claim sent ahead): the
                return view  # later one brought all this and more
            trials = view.trials
            touched = view.touched
            waiting = TrialState.WAITING
            for trial in changed:  # (rows, or trials from a server without the JSON form)
                row = type(trial) is list
                number = trial[1] if row else trial.number
                if touched is not None:
                    touched.add(number)
                if number >= len(trials):
                    view.holes += number + 1 - len(trials)
                    trials.extend([None] * (number + 1 - len(trials)))
                if trials[number] is None:
                    view.holes -= 1
                trials[number] = trial
                if (trial[2] == waiting.value) if row else (trial.state == waiting):
                    view.waiting.add(number)
                else:
                    view.waiting.discard(number)
            for trial in [*self._own.values(), *self._unsent.values()]:  # with what is not sent yet (until the
                # server has it finished)
                number = trial.number
                if number < len(trials) and trials[number] is not None and not state_of(trials[number]).is_finished():
                    trials[number] = trial
            view.cursor = head["cursor"]
            return view

    # Each call blocks the tuner's thread while the executor's thread runs: its answer then waits for the
    # interpreter lock up to the switch interval (5 ms by default), which made a 0.2 ms call take 2-8 ms.
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ExperimentalWarning
        proxy = StudyServerClient(host=host.strip("[]"), port=int(port))
    proxy._finished = {}  # trial id -> this process's trial just finished (tell reads it once more)
    try:
        proxy.wait_server_ready(timeout=timeout)
    except (ConnectionError, grpc.FutureTimeoutError):  # (optuna raises ConnectionError)
        raise ConfigurationError(f"--optuna-storage {url}: no study server answered within {timeout:g} s; start "
                                 "one there with `mneme study-server DATABASE_URL --port PORT`") from None
    return proxy


def _record_lock(path: str) -> Any:
    """A blocking POSIX record lock (``fcntl.lockf``) for the journal file.

    Optuna's own journal locks create a file and, while another process holds it, poll with sleeps
    that double up to a second: two tuners appending a dozen records per trial each then spent most of
    their time asleep (two processes together ran slower than one). ``lockf`` waits in
    the kernel and wakes at the release; it works on local filesystems and on NFS (through the lock
    manager) and Lustre mounted with ``flock``/``localflock``.
    """
    import fcntl

    try:
        from optuna.storages.journal._file import BaseJournalFileLock
    except ImportError:  # the backend only calls acquire() and release()
        BaseJournalFileLock = object

    class RecordLock(BaseJournalFileLock):
        def __init__(self) -> None:
            self._fd: int | None = None

        def acquire(self) -> bool:
            fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            return True

        def release(self) -> None:
            fd, self._fd = self._fd, None
            if fd is not None:
                fcntl.lockf(fd, fcntl.LOCK_UN)
                os.close(fd)

    return RecordLock()


#: How often a journal file is forced to disk (``fsync``), at most: see ``_journal_storage``.
JOURNAL_FSYNC_INTERVAL_S = 1.0


def _journal_storage(path: str, backend: Any = None) -> Any:
    """Optuna's JournalStorage over the file ``path`` (or over ``backend``, a journal backend of it: a study
    server's), at a small cost per trial.

    Optuna's file backend forces every append to disk (``fsync``, under the file lock): a trial is ~9
    appends (create, its parameters, the hash tag, user attributes, tell), so one tuner spent most of
    its time in ``fsync``, far below what its servers could give. Two changes:

    * each append is written and flushed under the lock and closed, which is what makes it visible to
      the other processes (on one node through the page cache; NFS flushes on close, Lustre is
      coherent); it is forced to disk at most every ``JOURNAL_FSYNC_INTERVAL_S`` and when the tuner
      closes the study (``sync``). A machine that crashes can lose the last second of appends, whose
      trials ``--resume`` replays again (``trials.jsonl`` is the tuner's own record of them);
    * a trial's user attributes go in one append, not one each (``set_trial_user_attrs``).
    """
    import json

    from optuna.storages.journal import JournalFileBackend, JournalStorage
    from optuna.storages.journal._file import get_lock_file
    from optuna.storages.journal._storage import JournalOperation

    class JournalFile(JournalFileBackend):
        _synced = 0.0

        def append_logs(self, logs: list[dict[str, Any]]) -> None:
            text = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode("utf-8")
            with get_lock_file(self._lock):
                with open(self._file_path, "ab") as f:
                    f.write(text)
                    f.flush()
                    now = time.monotonic()
                    if now - self._synced >= JOURNAL_FSYNC_INTERVAL_S:
                        os.fsync(f.fileno())
                        self._synced = now

        def sync(self) -> None:
            with open(self._file_path, "ab") as f:
                os.fsync(f.fileno())

    class Journal(JournalStorage):
        def set_trial_user_attrs(self, trial_id: int, attrs: dict[str, Any]) -> None:
            """``set_trial_user_attr`` of each of ``attrs``, in one append."""
            with self._thread_lock:
                worker = self._replay_result.worker_id
                self._backend.append_logs([{"op_code": JournalOperation.SET_TRIAL_USER_ATTR, "worker_id": worker,
                                            "trial_id": trial_id, "user_attr": {name: value}}
                                           for name, value in attrs.items()])
                self._sync_with_backend()

        def sync(self) -> None:
            self.flush()
            sync = getattr(self._backend, "sync", None)
            if sync is not None:
                sync()

        def flush(self) -> None:
            """Write out what the backend holds (a study server's journal: before it answers a call)."""
            flush = getattr(self._backend, "flush", None)
            if flush is not None:
                flush()

        def close(self) -> None:
            """On disk, and the file let go (a study server's: its lock)."""
            self.sync()
            close = getattr(self._backend, "close", None)
            if close is not None:
                close()

    return Journal(backend if backend is not None else JournalFile(path, lock_obj=_record_lock(path)))


def _with_postgres_driver(url: str) -> str:
    """``postgresql://`` names no driver, and SQLAlchemy's default changed (psycopg2 until 2.0, psycopg 3
    since 2.1): use whichever is installed."""
    import importlib.util

    head, sep, rest = url.partition("://")
    if head not in ("postgresql", "postgres") or not sep:
        return url
    for module, driver in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return f"postgresql+{driver}://{rest}"
    raise ConfigurationError(f"--optuna-storage {url}: no PostgreSQL driver is installed; pip install psycopg2-binary")


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class SharedStudyStrategy(OptunaSamplingStrategy):
    """:class:`OptunaSamplingStrategy` on a storage other processes share, with study-wide claims."""

    def __init__(self, space: SearchSpace, sampler: str = "tpe", *, storage: Any, results_dir: str = "",
                 **options: Any) -> None:
        store = open_storage(storage) if isinstance(storage, str) else storage
        super().__init__(space, sampler, storage=store, **options)
        self._storage = self.study._storage
        hold = getattr(self._storage, "hold", None)
        if hold is not None:  # a study server's client: trial ends go with the next call (``flush``, ``close``)
            hold()
            self._storage.read_user_attrs(READ_USER_ATTRS)
            self._storage.skip_unclaimed()
        self._study_id = self.study._study_id
        self._foreign: dict[str, int] = {}  # hash -> number of the other process's trial that owns it
        self._waiting: dict[str, list[Any]] = {}  # hash -> our duplicate trials waiting for that owner
        self._running_elsewhere: set[str] = set()  # hashes other processes are evaluating
        self._enqueued: set[str] = set()  # hashes of WAITING trials (enqueued, not taken yet)
        self._elsewhere_of: dict[int, str] = {}  # number -> hash, of the trials other processes evaluate
        self._enqueued_of: dict[int, str] = {}  # number -> hash, of the WAITING trials
        self._scanned = 0  # trials 0.._scanned-1 have been looked at
        self._open: set[int] = set()  # numbers of trials not seen finished (or not seen tagged) yet
        self._ended: set[int] = set()  # numbers of trials seen finished (where the server decides claims)
        self._claims: dict[str, set[int]] = {}  # hash -> tagged, non-duplicate, not failed trials
        self._trial_list: list[Any] = []
        self.results_dir = results_dir
        self.worker = worker_name()
        self.skipped_elsewhere = 0
        self._untagged_ok: set[int] = set()  # untagged trials taken as abandoned
        self._ready: list[Candidate] = []  # drawn ahead, claims won: the next asks take them first
        self._pending: collections.deque[tuple[list[tuple[Any, Candidate]], Callable[[], list[int]]]] = \
            collections.deque()  # claims sent ahead, oldest first: (the draws, what waits for their owners)
        self._ahead = 0  # the most one ask took (``flush`` keeps ``AHEAD_ASKS`` times that drawn ahead)
        self._looked = 0.0  # when this process last looked at the study (``time.monotonic``)

    # -- what the study knows ------------------------------------------------------------
    def _is_known(self, key: str) -> bool:
        """Also a configuration other processes evaluate, or enqueued and not taken yet (not enqueued again;
        the space is not used up while it waits: whoever asks next takes it)."""
        return (key in self._values or key in self._in_flight or key in self._running_elsewhere
                or key in self._enqueued)

    def _distinct_seen(self) -> int:
        """The distinct configurations known, or where the space is larger than their count could be, that
        bound (it is only compared with the space's size: the exact count costs a pass over the others' running
        trials)."""
        values, in_flight = self._values, self._in_flight
        bound = len(values) + len(in_flight) + len(self._running_elsewhere)
        if self.size is not None and bound < self.size:
            return bound
        # (the known values are many, the rest few: count the few that are not among them)
        return (len(values) + sum(1 for key in in_flight if key not in values)
                + sum(1 for key in self._running_elsewhere if key not in values and key not in in_flight))

    def _sync(self) -> None:
        """Catch up with the study: other processes' new, tagged and finished trials, and duplicates whose
        claim ended. Incremental: only trials not seen finished are looked at again, and of those, where
        the storage says which trials changed since the last look (a study server's client), only those."""
        import optuna

        self._looked = time.monotonic()
        running, complete, pruned, waiting = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.COMPLETE,
                                              optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.WAITING)
        look = getattr(self._storage, "look", None)
        decided = look is not None and self._storage.decides_claims()  # (no claims to keep here: the server's)
        if decided:  # a study server's client: the trials changed since the last look, read off its rows (the
            # others' trials made ahead, not claimed yet, come once they are: a number not seen is no claim)
            ended = self._ended
            looked_at = [o for o in look(self._study_id) if o[0] not in ended]
            self._open.update(o[0] for o in looked_at)
        else:
            trials = self._storage.get_all_trials(self._study_id, deepcopy=False)
            if any(t.number != i for i, t in zip(range(self._scanned, len(trials)), trials[self._scanned:])):
                raise AssertionError("the storage returned the study's trials out of order")
            self._open.update(range(self._scanned, len(trials)))
            self._scanned = len(trials)
            self._trial_list = trials
            looked_at = [(t.number, t.state, t.values, t.system_attrs, t.user_attrs)
                         for t in (trials[n] for n in sorted(self._open))]
        for number, state, values, system_attrs, user_attrs in looked_at:
            self._elsewhere_of.pop(number, None)
            self._enqueued_of.pop(number, None)
            key = system_attrs.get(HASH_ATTR)
            duplicate = DUPLICATE_ATTR in system_attrs
            if decided or key is None:
                pass
            elif not duplicate:
                self._claims.setdefault(key, set()).add(number)
            else:
                self._claims.get(key, set()).discard(number)
            if state == waiting:  # its claim counts; whoever asks next takes it
                if key is not None and not duplicate:
                    self._enqueued_of[number] = key
                continue
            if state == running:
                if key is not None and not duplicate and key not in self._in_flight:
                    self._elsewhere_of[number] = key
                continue
            self._open.discard(number)  # finished: its outcome does not change any more
            if decided:
                self._ended.add(number)
            if key is None or duplicate:
                continue
            if state == complete and values is not None:
                self._values.setdefault(key, tuple(values))
            elif state == pruned:
                self._values.setdefault(key, PRUNED)
            elif "status" in user_attrs:  # evaluated, and the configuration failed
                self._values.setdefault(key, FAILED)
                self._failed.setdefault(key, str(user_attrs["status"]))
            else:  # failed without an outcome (its process stopped): its claim is released
                if not decided:
                    self._claims[key].discard(number)
                continue
            self._claim_of.setdefault(key, number)
        self._running_elsewhere = set(self._elsewhere_of.values()) - self._values.keys()
        self._enqueued = set(self._enqueued_of.values()) - self._values.keys()
        for key, owner in list(self._foreign.items()):
            if (owner not in self._ended) if decided else (owner in self._open or owner >= self._scanned):
                # running, or not seen yet (a study server's
                continue  # claim may name a trial created after this process's last look)
            del self._foreign[key]
            waiting = self._waiting.pop(key, [])
            if key in self._values:
                for trial in waiting:
                    self._tell_known(trial, key)
            else:  # the claim was released (its process stopped): the configuration is free again
                for trial in waiting:
                    tell(self.study, trial, state=optuna.trial.TrialState.FAIL)

    def _owner(self, number: int, key: str) -> int:
        """The number of the trial that evaluates ``key``, as seen by trial ``number`` (tagged with it)."""
        deadline = time.monotonic() + TAG_WAIT_S
        while True:
            self._sync()
            untagged = [n for n in self._open if n < number and n not in self._untagged_ok
                        and HASH_ATTR not in self._trial_list[n].system_attrs
                        and self._trial_list[n].state.name == "RUNNING"]
            if not untagged:
                break
            if time.monotonic() >= deadline:
                log.warning("trials %s stayed untagged for %gs: taken as abandoned", untagged, TAG_WAIT_S)
                self._untagged_ok.update(untagged)
                break
            time.sleep(0.002)
        lower = [n for n in self._claims.get(key, ()) if n < number]
        return min(lower) if lower else number

    # -- ask/tell ------------------------------------------------------------------------
    def ask_many(self, count: int) -> list[Candidate]:
        """Also the candidates drawn ahead (:meth:`flush`) whose claims this process won, first: an ask they
        cover costs no call; the answers to the claims sent ahead are waited for, oldest first, only while they
        do not."""
        self._collect(waiting=False)
        while len(self._ready) < count and self._pending:
            self._collect_oldest()
        self._ahead = max(self._ahead, count)
        if len(self._ready) >= count:
            out, self._ready = self._ready[:count], self._ready[count:]
            return out
        out, self._ready = self._ready, []
        reserve = getattr(self._storage, "reserve", None)
        if reserve is not None:  # a study server's client: the batch's trials made in one call (with the news)
            reserve(self._study_id, count - len(out))
        self._sync()
        return out + super().ask_many(count - len(out))

    def _collect(self, waiting: bool = True) -> None:
        """The answers to the claims sent ahead (``waiting``: all of them, else those in so far, in the order
        they went): the candidates won wait for the next asks."""
        while self._pending and (waiting or self._pending[0][1].done()):
            self._collect_oldest()

    def _collect_oldest(self) -> None:
        due, owners = self._pending.popleft()
        self._ready += self._won(due, owners())

    def _settled(self, trial: Any, candidate: Candidate) -> bool | None:
        """Also settled: a configuration another process claimed first (its values come through the study).
        Through a study server the claim is decided with the batch's others (None)."""
        key = candidate.hash
        claim = getattr(self._storage, "claim", None)
        if key in self._values or key in self._in_flight or claim is None:
            self._storage.set_trial_system_attr(trial._trial_id, HASH_ATTR, key)
        if key in self._values or key in self._in_flight:
            return super()._settled(trial, candidate)
        decides = getattr(self._storage, "decides_claims", None)
        if decides is not None and decides():
            return None
        # A study server decides the claim in one call (it tags the trial, and marks a duplicate);
        # elsewhere the lowest-numbered tagged trial owns the hash.
        owner = claim(self._study_id, trial._trial_id, key) if claim is not None else None
        if owner is None:
            if claim is not None:  # a plain Optuna proxy: tag here
                self._storage.set_trial_system_attr(trial._trial_id, HASH_ATTR, key)
            owner = self._owner(trial.number, key)
        elif owner != trial.number:
            self.skipped_elsewhere += 1
            self.skipped_duplicates += 1
            self._settle_duplicate(trial, key, owner)
            return True
        if owner == trial.number:
            return False
        self.skipped_elsewhere += 1
        self._duplicate(trial, owner)
        self._settle_duplicate(trial, key, owner)
        return True

    def _decide(self, due: list[tuple[Any, Candidate]]) -> list[Candidate]:
        """The study server's claims of ``due`` in one call: the candidates this process won; the others are
        duplicates of the winners (with the trials of this batch that waited on them)."""
        return self._won(due, self._storage.claim_many(self._study_id, [(trial._trial_id, c.hash) for trial, c in due]))

    def _won(self, due: list[tuple[Any, Candidate]], owners: list[int]) -> list[Candidate]:
        """The candidates of ``due`` whose claims the server gave this process (``owners``: each claim's owner)."""
        won = []
        for (trial, candidate), owner in zip(due, owners):
            key = candidate.hash
            if owner == trial.number:
                self._trials[trial.number] = trial
                won.append(candidate)
                continue
            waiting = self._in_flight.pop(key, [])
            del self._claim_of[key]
            self.skipped_elsewhere += 1
            self.skipped_duplicates += 1
            self._settle_duplicate(trial, key, owner)
            for duplicate in waiting:  # (counted when drawn) it waited on this batch's trial, which lost to ``owner``
                self._mark_duplicate(duplicate, owner)
                self._settle_duplicate(duplicate, key, owner)
        if len(won) < len(due):
            self._sync()  # what the others run (the answer brought it): not drawn again
        return won

    def _enqueue(self, params: dict[str, Any], key: str, user_attrs: dict[str, Any] | None = None) -> None:
        """Enqueue the point tagged with its hash in the same write: the WAITING trial is a claim from its
        creation, so a trial created after it (a higher number) that draws the same configuration is its
        duplicate, whoever takes the WAITING trial and whenever."""
        import optuna

        self.study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.WAITING, system_attrs={"fixed_params": params, HASH_ATTR: key},
            user_attrs=user_attrs or {}))

    def _settle_duplicate(self, trial: Any, key: str, owner: int) -> None:
        """Tell ``trial`` its owner's values, now or once they are in the study."""
        if key in self._values:  # the claim finished meanwhile
            self._tell_known(trial, key)
        else:
            self._foreign[key] = owner
            self._waiting.setdefault(key, []).append(trial)

    def _duplicate(self, trial: Any, owner: int) -> None:
        self.skipped_duplicates += 1
        self._mark_duplicate(trial, owner)

    def _attributes(self, candidate: Candidate, outcome: Any) -> dict[str, Any]:
        """Also which process evaluated the trial and where its results directory is."""
        attrs = super()._attributes(candidate, outcome)
        attrs["mneme"].update(worker=self.worker, results_dir=self.results_dir)
        return attrs

    def _set_user_attrs(self, trial: Any, attrs: dict[str, Any]) -> None:
        """All in one append to a journal file, else one write each (each a transaction)."""
        set_all = getattr(self._storage, "set_trial_user_attrs", None)
        if set_all is not None:
            set_all(trial._trial_id, attrs)
            return
        super()._set_user_attrs(trial, attrs)

    def flush(self, upcoming: int | None = None) -> None:
        """Send the trial ends and attributes a study server's client keeps for its next call.

        Through a study server, they go with the claims of the candidates drawn ahead, now: ``AHEAD_ASKS`` asks'
        worth (the most one ask took, that many times), less those won or on their way, and no more than
        ``upcoming``. The call travels while the loop waits for results, and up to ``CLAIMS_IN_FLIGHT`` claim
        calls are on their way at once: the next asks take what they won, and wait for them only when what was
        won before does not cover them.

        Args:
            upcoming: the most candidates the loop will still ask for (None: no limit known).
        """
        later = getattr(self._storage, "claim_many_later", None)
        if later is not None and self._storage.decides_claims():
            self._collect(waiting=False)  # (those answered: no wait)
            drawn = len(self._ready) + sum(len(due) for due, _ in self._pending)
            want = AHEAD_ASKS * self._ahead - drawn
            if upcoming is not None:
                want = min(want, upcoming - drawn)
            if len(self._pending) < CLAIMS_IN_FLIGHT and want > 0:
                self._storage.reserve(self._study_id, want)  # (the last claims made most of them)
                if time.monotonic() - self._looked >= LOOK_INTERVAL_S:
                    self._sync()
                due = self._draw(len(self._ready) + want, self._ready, _Draws())
                if due:
                    # (the trials made with them: for the next draws, two asks' worth at most)
                    rest = 2 * self._ahead
                    if upcoming is not None:
                        rest = min(rest, max(0, upcoming - drawn - len(due)))
                    self._pending.append((due, later(self._study_id, [(trial._trial_id, c.hash) for trial, c in due],
                                                     rest)))
                    return
            self._storage.flush(study_id=self._study_id)  # (the news comes back with the call, for the next look)
            return
        flush = getattr(self._storage, "flush", None)
        if flush is not None:
            flush()

    def close(self) -> None:
        """Fail this process's trials still running (Ctrl-C, a stop): their configurations are free again."""
        import optuna

        try:
            self._collect()  # (the claims sent ahead: their trials are this process's to release)
        except Exception as exc:  # noqa: BLE001 - the server went away: say so
            log.warning("could not collect the claims sent ahead: %s", exc)
            self._pending.clear()
        self._ready = []
        leftover = list(self._trials.values())
        leftover += [t for waiting in self._in_flight.values() for t in waiting]
        leftover += [t for waiting in self._waiting.values() for t in waiting]
        self._trials.clear()
        self._in_flight.clear()
        self._waiting.clear()
        for trial in leftover:
            try:
                tell(self.study, trial, state=optuna.trial.TrialState.FAIL)
            except Exception as exc:  # noqa: BLE001 - already finished, or the storage went away: say so
                log.warning("could not release trial %d: %s", trial.number, exc)
        flush = getattr(self._storage, "flush", None)
        if flush is not None:  # a study server's client: what it kept, and the trial it made ahead released
            try:
                flush(release=True)
            except Exception as exc:  # noqa: BLE001 - the server went away: say so
                log.warning("could not send the last trial ends to the study server: %s", exc)
        sync = getattr(self._storage, "sync", None)
        if sync is not None:  # a journal file: its last appends on disk
            try:
                sync()
            except OSError as exc:
                log.warning("could not force the journal to disk: %s", exc)
