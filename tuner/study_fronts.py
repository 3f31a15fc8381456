"""Front processes of ``mneme study-server --fronts N``: gRPC and the tuners' reads outside the core.

Each front process serves gRPC on the server's port (``SO_REUSEPORT``: the kernel gives each new
connection to one of them). A batch of a tuner's changes (``Apply``) is parsed here and made into the
journal logs it writes (with their lines of the journal file), which go to the core
(``tuner.study_core``) over a pipe; the core checks and writes them and decides the claims. Every answer
of the core brings the logs written since this front's last call, which the front applies to its
:class:`~tuner.study_replica.StudyReplica`: the study's changes a tuner reads (``Changes``, and those that
come back with ``Apply``) are encoded here, from a replica that has at least every change the core had
made when it answered. Optuna's other methods go to the core as they came. The core answers the calls of
one pipe in order, one at a time, so a front matches answers to calls by order.
"""

from __future__ import annotations

import collections
import datetime
import json
import logging
import marshal
import threading
from typing import Any, Callable

log = logging.getLogger("mneme.study_server")

from mneme._internal.heap import Heap
from tuner.study_json import encode as _encode  # the journal's lines
from tuner.study_replica import SET_TRIAL_SYSTEM_ATTR, SET_TRIAL_USER_ATTR, TEXTS

#: A front fetches the others' logs while idle: every (first) seconds while they come, backing off to (second).
KEEP_UP_S = (0.002, 0.1)


def front_main(conn: Any, address: str, index: int, settings: dict[str, str]) -> None:
    """One front process: serve gRPC on ``address`` (the first front: report the port it bound, the others:
    bind the same port) until the core's end of ``conn`` closes.

    Args:
        conn: this front's end of its pipe to the core.
        address: ``HOST:PORT`` to listen on (port 0: a free one; the first front only).
        index: the front's number (0: the first).
        settings: the core's :meth:`~tuner.study_core.StudyCore.settings`.
    """
    import asyncio
    import signal

    for signum in (signal.SIGINT, signal.SIGTERM):  # the core stops the fronts (their pipes close), not a signal
        signal.signal(signum, signal.SIG_IGN)
    try:
        asyncio.run(_serve(conn, address, index, settings))
    except (EOFError, OSError, KeyboardInterrupt):
        pass


async def _serve(conn: Any, address: str, index: int, settings: dict[str, str]) -> None:
    import asyncio

    import grpc

    from tuner.strategies.shared_study import APPLY_METHOD, CHANGES_METHOD
    from tuner.study_core import APPLY, OK, SYNC

    loop = asyncio.get_running_loop()
    pending: collections.deque[asyncio.Future] = collections.deque()
    closed = asyncio.Event()
    front = Front(settings, index)

    def receive() -> None:  # the core's answers, in the order of the calls
        while True:
            try:
                data = conn.recv_bytes()
            except (EOFError, OSError):
                loop.call_soon_threadsafe(closed.set)
                return
            future = pending.popleft()
            loop.call_soon_threadsafe(resolve, future, data)

    def resolve(future: asyncio.Future, data: bytes) -> None:
        """(on the loop, in the order of the answers) the logs into the replica, then the call's answer."""
        answer = front.take(data)
        if not future.done():
            future.set_result(answer)

    async def core(method: bytes, payload: bytes) -> Any:
        future = loop.create_future()
        pending.append(future)  # (before the send: the answer may come at once)
        conn.send_bytes(method + b"\n" + payload)
        status, body = await future
        if status != OK:
            raise _Refused(*body)
        return body

    async def keep_up() -> None:
        """While no call waits, fetch the other fronts' logs (every 2 ms while they come, up to every 0.1 s):
        a tuner's call then waits for its own work, not for the replica to take in everyone's."""
        pause = KEEP_UP_S[0]
        while not closed.is_set():
            await asyncio.sleep(pause)
            if pending:
                continue
            await core(SYNC, b"")
            pause = KEEP_UP_S[0] if front.news else min(KEEP_UP_S[1], 2 * pause)

    async def apply(request: bytes) -> bytes:
        payload, parsed, starts = front.apply_request(request)
        return front.apply_answer(await core(APPLY, payload), parsed, starts)

    async def changes(request: bytes) -> bytes:
        parsed = front.changes_request(request)
        await core(SYNC, b"")
        return front.changes_answer(parsed)

    def handler(function: Callable[[bytes], Any]) -> Any:
        async def call(request: bytes, context: Any) -> Any:
            try:
                return await function(request)
            except _Refused as exc:
                await context.abort(getattr(grpc.StatusCode, exc.args[0], grpc.StatusCode.INTERNAL), exc.args[1])

        return grpc.unary_unary_rpc_method_handler(call)  # bytes in, bytes out

    handlers = {APPLY_METHOD: handler(apply), CHANGES_METHOD: handler(changes)}

    class Forward(grpc.GenericRpcHandler):
        def service(self, details: Any) -> Any:
            found = handlers.get(details.method)
            if found is not None:
                return found
            method = details.method.encode()

            async def forward(request: bytes) -> bytes:
                return await core(method, request)

            return handler(forward)

    server = grpc.aio.server(options=[("grpc.so_reuseport", 1)])
    server.add_generic_rpc_handlers([Forward()])
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if not bound:
        conn.send(("failed", f"cannot listen on {address}"))
        return
    await server.start()
    conn.send(("bound", bound))
    threading.Thread(target=receive, name="core-answers", daemon=True).start()
    keeping_up = asyncio.ensure_future(keep_up())
    try:
        await closed.wait()
    finally:
        keeping_up.cancel()
        await server.stop(1.0)
        front.close()


class Front:
    """What a front does with the calls it passes on, without the gRPC and the pipe (see the module).

    Args:
        settings: the core's :meth:`~tuner.study_core.StudyCore.settings`.
        index: the front's number (an ``Apply`` that asks for ``"front"`` is told it and how many there are).
    """

    def __init__(self, settings: dict[str, str], index: int = 0) -> None:
        from tuner.study_replica import StudyReplica

        self.where = [index, int(settings.get("fronts", 1))]
        self.replica = StudyReplica(full=True, generation=settings["generation"])
        self.batches = Batches(settings["worker_id"])
        self._heap = Heap()  # (the replica stays: the collector looks only at what is new)
        self.news = False  # whether the core's last answer brought logs

    def close(self) -> None:
        """The front's work is over: its heap goes back to the collector (see ``mneme._internal.heap``)."""
        self._heap.release()

    def take(self, data: bytes) -> tuple[int, Any]:
        """A core's answer (``tuner.study_core``'s wire form): its logs into the replica; (status, body)."""
        status, body, chunks = marshal.loads(data)
        for chunk in chunks:
            self.replica.apply_all(marshal.loads(chunk))
        self.news = bool(chunks)
        self._heap.settle()
        return status, body

    def apply_request(self, request: bytes) -> tuple[bytes, dict[str, Any], list[str | None]]:
        """An ``Apply`` request: (the core's payload, the request, the new trials' start times);
        ``_Refused`` where it is not one."""
        try:
            parsed = json.loads(request)
            tolerate = parsed.get("tolerate", 0)
            entries, starts = self.batches.entries(parsed["ops"])
        except (KeyError, TypeError, IndexError, ValueError, AttributeError):
            raise _Refused("INVALID_ARGUMENT", Batches.USAGE) from None
        return marshal.dumps((tolerate if isinstance(tolerate, int) else 0, entries)), parsed, starts

    def apply_answer(self, results: list[Any], parsed: dict[str, Any], starts: list[str | None]) -> bytes:
        """The ``Apply`` answer of the core's results (with the study's changes where the request asks)."""
        answer = json.dumps({"results": self.batches.results(results, starts),
                             **({"front": self.where} if parsed.get("front") else {})}).encode()
        if "changes" not in parsed:
            return answer
        cursor, reply, form = self._changed(parsed["changes"])
        head = {"cursor": cursor, "generation": self.replica.generation}
        if form == "json":  # (``[DISTRIBUTIONS, TRIALS]`` as they are: the tuner parses the answer once)
            changes = json.dumps({**head, "form": "json"}).encode()[:-1] + b', "trials": ' + reply + b"}"
        else:
            changes = json.dumps({**head, "trials": _base64(reply)}).encode()
        return answer[:-1] + b', "changes": ' + changes + b"}"

    @staticmethod
    def changes_request(request: bytes) -> Any:
        """A ``Changes`` request, parsed (None where it is not JSON: refused with the answer)."""
        try:
            return json.loads(request)
        except ValueError:
            return None

    def changes_answer(self, parsed: Any) -> bytes:
        """The ``Changes`` answer: a JSON head (cursor, generation), then Optuna's ``GetTrialsReply``."""
        cursor, reply, form = self._changed(parsed)
        head = {"cursor": cursor, "generation": self.replica.generation, **({"form": form} if form != "proto" else {})}
        encoded = json.dumps(head).encode()
        return len(encoded).to_bytes(4, "big") + encoded + reply

    def _changed(self, request: Any) -> tuple[int, bytes, str]:
        """(the cursor, the trials changed since the request's, their form)."""
        try:
            study_id, since, generation = int(request["study_id"]), int(request["since"]), str(request["generation"])
            user_attrs = request.get("user_attrs")
            if user_attrs is not None and not (isinstance(user_attrs, list)
                                               and all(isinstance(name, str) for name in user_attrs)):
                raise TypeError
            form = request.get("form", "proto")
            unclaimed = request.get("unclaimed", True)
            if form not in ("proto", "json") or not isinstance(unclaimed, bool):
                raise ValueError
        except (KeyError, TypeError, ValueError, AttributeError):
            raise _Refused("INVALID_ARGUMENT", 'give {"study_id": S, "since": C, "generation": G} (and '
                           '"user_attrs": [NAME, ...] to read only those, "form": "json" for JSON trials, '
                           '"unclaimed": false to leave out running trials no claim tags)') from None
        try:
            reply, cursor = self.replica.changes(study_id, since, generation, user_attrs, form, unclaimed)
        except KeyError as exc:
            raise _Refused("NOT_FOUND", str(exc.args[0]) if exc.args else "no such study") from None
        return cursor, reply, form


class _Refused(Exception):
    """A call refused with (status code name, details)."""


def _base64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode("ascii")


class Batches:
    """A tuner's ``Apply`` request made into the core's entries, and the core's results into the answer.

    An entry is ``(kind, args, logs, text)``: the journal logs of one operation (Optuna's journal form,
    with the core's worker id) and their lines; ``invalid`` entries carry the refusal of an operation that
    does not parse (the core refuses it in its place, so that the operations before it still apply).

    Args:
        worker_id: the worker id of the core's logs.
    """

    USAGE = ('give {"ops": [[NAME, ARGS...], ...]} with NAME one of create_new_trial, set_trial_param, '
             "set_trial_system_attr, set_trial_user_attrs, set_trial_state_values, claim")

    def __init__(self, worker_id: str) -> None:
        from optuna.trial import TrialState

        from tuner.strategies.shared_study import HASH_ATTR

        self.worker_id = worker_id
        self._worker_json = _encode(worker_id)
        self._hash_attr = HASH_ATTR
        self._hash_json = _encode(HASH_ATTR)
        self._states = {state.name: state for state in TrialState}
        self._distributions: dict[str, tuple[str, str]] = {}  # a distribution's JSON -> (Optuna's JSON of it,
        # that as a JSON string)
        self._makers = {"create_new_trial": self._create, "set_trial_param": self._param,
                        "set_trial_system_attr": self._system_attr, "set_trial_user_attrs": self._user_attrs,
                        "set_trial_state_values": self._state, "claim": self._claim}
        self._names: dict[str, str] = {}  # a parameter's or attribute's name -> its JSON
        self._now: str | None = None  # the time of the request being made into entries (one for all of them)

    def entries(self, ops: list[list[Any]]) -> tuple[list[tuple], list[str | None]]:
        """(the core's entries of ``ops``, the start time each new trial's entry gave it); raises
        ``KeyError``/``TypeError``/``IndexError`` where ``ops`` is not a list of known operations."""
        makers = [(self._makers[op[0]], op[1:]) for op in ops]
        entries, starts = [], []
        self._now = None
        for maker, args in makers:
            try:
                entry = maker(*args)
            except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
                kind = type(exc).__name__ if isinstance(exc, (KeyError, TypeError)) else "ValueError"
                entry = ("invalid", (kind, str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)),
                         [], b"")
            entries.append(entry)
            starts.append(entry[2][0]["datetime_start"] if entry[0] == "create" else None)
        return entries, starts

    @staticmethod
    def results(results: list[Any], starts: list[str | None]) -> list[Any]:
        """The core's results as the tuner reads them."""
        out: list[Any] = []
        for result, start in zip(results, starts):
            if isinstance(result, tuple) and result and result[0] == "error":
                out.append({"error": result[1]})
            elif start is not None and isinstance(result, tuple):
                local = datetime.datetime.fromisoformat(start).astimezone().replace(tzinfo=None)
                out.append({"trial_id": result[0], "number": result[1], "datetime_start": local.isoformat()})
            else:
                out.append(result)
        return out

    def _entry(self, kind: str, args: tuple, logs: list[dict[str, Any]]) -> tuple:
        return (kind, args, logs, "".join(_encode(entry) + "\n" for entry in logs).encode("utf-8"))

    def _stamp(self) -> str:
        """The time of the request's trial starts and ends (UTC, in microseconds)."""
        if self._now is None:
            self._now = datetime.datetime.now(tz=datetime.timezone.utc).isoformat(timespec="microseconds")
        return self._now

    def _name(self, name: str) -> str:
        """``name`` as JSON (a study has few distinct ones)."""
        text = self._names.get(name)
        if text is None:
            text = _encode(name)
            if len(self._names) < 4096:
                self._names[name] = text
        return text

    def _create(self, study_id: Any) -> tuple:
        study_id = int(study_id)
        now = self._stamp()
        line = f'{{"op_code":4,"worker_id":{self._worker_json},"study_id":{study_id},"datetime_start":"{now}"}}\n'
        return ("create", (), [{"op_code": 4, "worker_id": self.worker_id, "study_id": study_id,
                                "datetime_start": now}], line.encode("utf-8"))

    def _param(self, trial_id: Any, name: Any, value: Any, distribution: Any) -> tuple:
        if not isinstance(name, str):
            raise TypeError(f"a parameter's name is a string, not {name!r}")
        known = self._distributions.get(distribution)
        if known is None:
            from optuna.distributions import distribution_to_json, json_to_distribution

            text = distribution_to_json(json_to_distribution(distribution))
            known = (text, _encode(text))
            if len(self._distributions) < 4096:
                self._distributions[distribution] = known
        trial_id, value = int(trial_id), float(value)
        line = (f'{{"op_code":5,"worker_id":{self._worker_json},"trial_id":{trial_id},"param_name":{self._name(name)},'
                f'"param_value_internal":{_encode(value)},"distribution":{known[1]}}}\n')
        return ("param", (), [{"op_code": 5, "worker_id": self.worker_id, "trial_id": trial_id, "param_name": name,
                               "param_value_internal": value, "distribution": known[0]}], line.encode("utf-8"))

    def _system_attr(self, trial_id: Any, key: Any, value: Any) -> tuple:
        return self._attrs(SET_TRIAL_SYSTEM_ATTR, "system_attr", int(trial_id), {str(key): value})

    def _user_attrs(self, trial_id: Any, attrs: Any) -> tuple:
        return self._attrs(SET_TRIAL_USER_ATTR, "user_attr", int(trial_id),
                           {str(name): value for name, value in dict(attrs).items()})

    def _attrs(self, op_code: int, field: str, trial_id: int, attrs: dict[str, Any]) -> tuple:
        """A log per attribute; each value encoded once, for its line and for the replicas, and carried as that
        text only (``TEXTS``; the journal decodes it where Optuna's storage reads the log)."""
        logs, lines = [], []
        for name, value in attrs.items():
            text = _encode(value)
            logs.append({"op_code": op_code, "worker_id": self.worker_id, "trial_id": trial_id, TEXTS: {name: text}})
            lines.append(f'{{"op_code":{op_code},"worker_id":{self._worker_json},"trial_id":{trial_id},'
                         f'"{field}":{{{self._name(name)}:{text}}}}}\n')
        return ("attrs", (), logs, "".join(lines).encode("utf-8"))

    def _state(self, trial_id: Any, state: Any, values: Any = None) -> tuple:
        state = self._states[state]
        entry: dict[str, Any] = {"op_code": 6, "worker_id": self.worker_id, "trial_id": int(trial_id),
                                 "state": int(state.value),
                                 "values": None if values is None else [float(v) for v in values]}
        now = self._stamp()
        if state.name == "RUNNING":
            entry["datetime_start"] = now
        elif state.is_finished():
            entry["datetime_complete"] = now
        return self._entry("state", (), [entry])

    def _claim(self, study_id: Any, trial_id: Any, key: Any) -> tuple:
        study_id, trial_id, key = int(study_id), int(trial_id), str(key)
        line = (f'{{"op_code":9,"worker_id":{self._worker_json},"trial_id":{trial_id},'
                f'"system_attr":{{{self._hash_json}:{_encode(key)}}}}}\n')
        return ("claim", (study_id, trial_id, key), [{"op_code": 9, "worker_id": self.worker_id, "trial_id": trial_id,
                                                      "system_attr": {self._hash_attr: key}}], line.encode("utf-8"))


class Fronts:
    """The core's side: the front processes and their pipes.

    Args:
        count: front processes.
        address: ``HOST:PORT`` they listen on (port 0: the first front picks one, the rest share it).
        settings: the core's :meth:`~tuner.study_core.StudyCore.settings`, for each front.
        startup_timeout: seconds a front may take to bind.
    """

    def __init__(self, count: int, address: str, settings: dict[str, str], startup_timeout: float = 60.0) -> None:
        import multiprocessing

        from mneme.errors import ConfigurationError

        context = multiprocessing.get_context("spawn")  # (no fork of a process with gRPC's threads)
        self.processes: list[Any] = []
        self.conns: list[Any] = []
        self.port = 0
        host = address.rsplit(":", 1)[0]
        try:
            for index in range(count):
                parent, child = context.Pipe()
                where = address if index == 0 else f"{host}:{self.port}"
                process = context.Process(target=front_main, args=(child, where, index, settings), daemon=True,
                                          name=f"study-front-{index}")
                process.start()
                child.close()
                self.processes.append(process)
                self.conns.append(parent)
                if not parent.poll(startup_timeout):
                    raise ConfigurationError(f"mneme study-server: front {index} did not start within "
                                             f"{startup_timeout:.0f} s")
                kind, value = parent.recv()
                if kind != "bound":
                    raise ConfigurationError(f"mneme study-server: {value}: the port is taken or the address is not "
                                             "this machine's; give another --port or --host")
                self.port = value
        except BaseException:
            self.stop()
            raise

    def serve(self, answer: Callable[[int, bytes, bytes], bytes], stop: threading.Event,
              after: Callable[[], None] | None = None, gone: Callable[[int], None] | None = None) -> bool:
        """Answer the fronts' calls until ``stop`` is set (or every front is gone).

        Args:
            answer: ``(front index, method, payload) -> answer bytes`` (``tuner.study_core``'s wire form).
            stop: ends the loop when set (looked at every 0.2 s at least).
            after: called after each batch of calls, before their answers go out (the journal written).
            gone: told the index of a front that went away.

        Returns:
            False when every front went away before ``stop`` was set.
        """
        from multiprocessing.connection import wait

        index_of = {id(conn): index for index, conn in enumerate(self.conns)}
        live = list(self.conns)
        while live and not stop.is_set():
            ready = wait(live, 0.2)
            answers = []
            for conn in ready:
                try:
                    data = conn.recv_bytes()
                except (EOFError, OSError):
                    live.remove(conn)
                    log.warning("a front process of the study server is gone; %d left", len(live))
                    if gone is not None:
                        gone(index_of[id(conn)])
                    continue
                method, _, payload = data.partition(b"\n")
                answers.append((conn, answer(index_of[id(conn)], method, payload)))
            if answers and after is not None:
                after()
            for conn, data in answers:
                try:
                    conn.send_bytes(data)
                except (BrokenPipeError, OSError):
                    pass
        return bool(live) or stop.is_set()

    def stop(self) -> None:
        """Close the pipes (each front stops on their end) and wait for the fronts."""
        for conn in self.conns:
            conn.close()
        for process in self.processes:
            process.join(3)
            if process.is_alive():
                process.kill()
                process.join(1)
