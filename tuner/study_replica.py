"""A study server's trials rebuilt from its journal's logs, at a few microseconds a log.

Optuna's journal storage applies each log to a copy of the trial it changes (and keeps the study as
``FrozenTrial`` objects); a study server with front processes (``tuner.study_fronts``) applies every
log in each of its processes, so it keeps less: per trial the fields that decide whether a change is
allowed (its study, number, state, whether it has a ``status``, its claim tags), and, where
``full`` (the fronts, which answer the tuners' reads), the trial as Optuna's proxy sends it (an
``api_pb2.Trial`` message). The rules are Optuna's journal rules (``JournalStorageReplayResult``): a
change of a trial that does not exist or has finished, a parameter whose distribution does not match
the study's earlier one, a second start of a running trial, a trial of a study that does not exist
are skipped; applied ``strict``, they raise as Optuna's storage does and nothing changes.
"""

from __future__ import annotations

import datetime
import functools
import json
from collections import OrderedDict
from typing import Any, Iterable

from optuna.exceptions import DuplicatedStudyError, UpdateFinishedTrialError

from tuner.strategies.shared_study import DUPLICATE_ATTR, HASH_ATTR
from tuner.study_json import encode as _json

#: Optuna's journal operation codes (``optuna.storages.journal._storage.JournalOperation``).
CREATE_STUDY, DELETE_STUDY, SET_STUDY_USER_ATTR, SET_STUDY_SYSTEM_ATTR = 0, 1, 2, 3
CREATE_TRIAL, SET_TRIAL_PARAM, SET_TRIAL_STATE_VALUES, SET_TRIAL_INTERMEDIATE_VALUE = 4, 5, 6, 7
SET_TRIAL_USER_ATTR, SET_TRIAL_SYSTEM_ATTR = 8, 9
#: Trial states (``optuna.trial.TrialState``, and the proxy's ``api_pb2.TrialState``: the same numbers).
RUNNING, COMPLETE, PRUNED, FAIL, WAITING = 0, 1, 2, 3, 4
NOT_FOUND = "Record does not exist."
UNUPDATABLE = "Trial#{trial_number} has already finished and can not be updated."
#: A log's key for its attribute values' JSON: a front's logs carry the values so (each value is encoded once,
#: and not decoded where only its text is needed); ``tuner.study_journal`` decodes them for Optuna's storage.
TEXTS = "value_json"
#: The field of an attribute log's values, by operation code.
ATTR_FIELDS = {SET_TRIAL_USER_ATTR: "user_attr", SET_TRIAL_SYSTEM_ATTR: "system_attr"}
#: The proxy's datetime form (Optuna's servicer: local time).
DATETIME_FORMAT = "%Y-%m-%d %H:%M:%S.%f"
#: Encoded trials a replica keeps (the latest used): those tuners are about to read again.
ENCODED_TRIALS_KEPT = 65536
TRIAL_FIELD = b"\x0a"  # GetTrialsReply.trials: field 1, length-delimited


class StudyReplica:
    """The studies and trials of a journal's logs (see the module).

    Args:
        full: also keep each trial as the proxy's ``Trial`` message (for :meth:`changes`).
        generation: names this server's run in cursors (a cursor of another run is not this one's).
    """

    def __init__(self, full: bool = False, generation: str = "") -> None:
        self.full = full
        self.generation = generation
        self._names: dict[str, int] = {}  # live study name -> id
        self._trial_ids: dict[int, list[int]] = {}  # study id -> its trial ids by number (kept after a delete)
        self._live: set[int] = set()
        self._next_study = 0
        self.study_of: list[int] = []  # by trial id
        self.number: list[int] = []
        self.state: list[int] = []
        self.with_status: set[int] = set()  # trial ids with the user attribute "status"
        self.tags: dict[int, str] = {}  # trial id -> its claim's hash
        self.duplicates: set[int] = set()  # trial ids marked duplicates
        self._first: dict[int, dict[str, tuple[int, str]]] = {}  # study -> name -> (number, distribution) of
        # the lowest-numbered trial with that parameter (the one Optuna checks a new one against)
        self._compatible: dict[tuple[str, str], str] = {}  # (earlier, new distribution) -> "" or the refusal
        self.touched: list[int] = []  # per log: the trial id it changed, or -1 (a cursor is an index)
        self._version: dict[int, int] = {}  # trial id -> the cursor after its last change
        self.trials: list[Trial] = []  # by trial id (``full``)
        # per (user attributes, form): trial id -> (version, encoded), the latest used last
        self._encoded: dict[tuple[frozenset[str] | None, str], OrderedDict[int, tuple[int, bytes, int]]] = {}
        self._sets: dict[tuple[tuple[str, str], ...], int] = {}  # a trial's distributions (JSON form) -> its id
        self._set_texts: list[bytes] = []  # by id: ``"ID":{NAME:DISTRIBUTION,...}``

    # -- logs --------------------------------------------------------------------------------
    def apply_all(self, logs: Iterable[dict[str, Any]]) -> None:
        """Apply logs, skipping those Optuna skips."""
        for log in logs:
            self.apply(log, False)

    def apply(self, log: dict[str, Any], strict: bool) -> Any:
        """Apply one log.

        Args:
            log: an Optuna journal log.
            strict: raise where the log would not apply (``KeyError``: no such trial or study;
                ``UpdateFinishedTrialError``; ``ValueError``: a distribution that does not match;
                ``DuplicatedStudyError``), instead of skipping it.

        Returns:
            a new trial's id; whether a state change applied (a second start of a running trial does not);
            None otherwise.
        """
        op = log["op_code"]
        if op == CREATE_TRIAL:
            return self._create_trial(log, strict)
        if op == SET_TRIAL_PARAM:
            return self._set_param(log, strict)
        if op == SET_TRIAL_STATE_VALUES:
            return self._set_state(log, strict)
        if op == SET_TRIAL_USER_ATTR or op == SET_TRIAL_SYSTEM_ATTR:
            return self._set_attrs(log, strict, op == SET_TRIAL_USER_ATTR)
        if op == SET_TRIAL_INTERMEDIATE_VALUE:
            return self._set_intermediate(log, strict)
        self._study_log(log, strict)
        self.touched.append(-1)
        return None

    def _changed(self, trial_id: int) -> None:
        self.touched.append(trial_id)
        self._version[trial_id] = len(self.touched)

    def _skipped(self) -> None:
        self.touched.append(-1)

    def _updatable(self, trial_id: int, strict: bool) -> bool:
        if not 0 <= trial_id < len(self.state):
            if strict:
                raise KeyError(NOT_FOUND)
            return False
        if self.state[trial_id] in (COMPLETE, PRUNED, FAIL):
            if strict:
                raise UpdateFinishedTrialError(UNUPDATABLE.format(trial_number=self.number[trial_id]))
            return False
        return True

    def _study_log(self, log: dict[str, Any], strict: bool) -> None:
        op = log["op_code"]
        if op == CREATE_STUDY:
            name = log["study_name"]
            if name in self._names:
                if strict:
                    raise DuplicatedStudyError
                return
            study_id = self._next_study
            self._next_study += 1
            self._names[name] = study_id
            self._trial_ids[study_id] = []
            self._live.add(study_id)
            return
        if op in (DELETE_STUDY, SET_STUDY_USER_ATTR, SET_STUDY_SYSTEM_ATTR):
            study_id = log["study_id"]
            if study_id not in self._live:
                if strict:
                    raise KeyError(NOT_FOUND)
                return
            if op == DELETE_STUDY:
                self._live.discard(study_id)
                self._names = {name: i for name, i in self._names.items() if i != study_id}
        # (other codes, DISCARD_TRIALS among them, are skipped as Optuna does)

    def _create_trial(self, log: dict[str, Any], strict: bool) -> int | None:
        study_id = log["study_id"]
        if study_id not in self._live:
            if strict:
                raise KeyError(NOT_FOUND)
            self._skipped()
            return None
        trial_id = len(self.state)
        ids = self._trial_ids[study_id]
        number = len(ids)
        state = int(log.get("state", RUNNING))
        ids.append(trial_id)
        self.study_of.append(study_id)
        self.number.append(number)
        self.state.append(state)
        distributions = log.get("distributions") or {}
        params = log.get("params") or {}
        for name, text in distributions.items():
            self._note_first(study_id, name, number, text)
        user_attrs = log.get("user_attrs") or {}
        system_attrs = log.get("system_attrs") or {}
        if "status" in user_attrs:
            self.with_status.add(trial_id)
        self._note_system(trial_id, system_attrs)
        if self.full:
            values = log.get("values")
            if values is None and log.get("value") is not None:
                values = [log["value"]]
            self.trials.append(Trial(
                trial_id, number, state, list(values or ()), _local(log.get("datetime_start")),
                _local(log.get("datetime_complete")), dict(params), dict(distributions),
                {key: json.dumps(value) for key, value in user_attrs.items()},
                {key: json.dumps(value) for key, value in system_attrs.items()},
                {int(step): value for step, value in (log.get("intermediate_values") or {}).items()}))
        self._changed(trial_id)
        return trial_id

    def _note_first(self, study_id: int, name: str, number: int, text: str) -> None:
        first = self._first.setdefault(study_id, {})
        known = first.get(name)
        if known is None or number < known[0]:
            first[name] = (number, text)

    def _note_system(self, trial_id: int, attrs: dict[str, Any]) -> None:
        if HASH_ATTR in attrs:
            self.tags[trial_id] = attrs[HASH_ATTR]
        if DUPLICATE_ATTR in attrs:
            self.duplicates.add(trial_id)

    def _set_param(self, log: dict[str, Any], strict: bool) -> None:
        trial_id = log["trial_id"]
        if not self._updatable(trial_id, strict):
            self._skipped()
            return None
        name, text = log["param_name"], log["distribution"]
        study_id = self.study_of[trial_id]
        first = self._first.get(study_id, {}).get(name)
        if first is not None and first[1] != text:
            refusal = self._refusal(first[1], text)
            if refusal:
                if strict:
                    raise ValueError(refusal)
                self._skipped()
                return None
        self._note_first(study_id, name, self.number[trial_id], text)
        if self.full:
            trial = self.trials[trial_id]
            trial.params[name] = log["param_value_internal"]
            trial.distributions[name] = text
            trial.texts = None
        self._changed(trial_id)
        return None

    def _set_intermediate(self, log: dict[str, Any], strict: bool) -> None:
        trial_id = log["trial_id"]
        if not self._updatable(trial_id, strict):
            self._skipped()
            return None
        if self.full:
            self.trials[trial_id].intermediate[int(log["step"])] = log["intermediate_value"]
        self._changed(trial_id)
        return None

    def _refusal(self, earlier: str, new: str) -> str:
        """Optuna's ``check_distribution_compatibility`` of two distributions' JSON ("" where they match)."""
        key = (earlier, new)
        refusal = self._compatible.get(key)
        if refusal is None:
            from optuna.distributions import check_distribution_compatibility, json_to_distribution

            try:
                check_distribution_compatibility(json_to_distribution(earlier), json_to_distribution(new))
                refusal = ""
            except ValueError as exc:
                refusal = str(exc) or "the distribution does not match the study's"
            if len(self._compatible) < 4096:
                self._compatible[key] = refusal
        return refusal

    def _set_state(self, log: dict[str, Any], strict: bool) -> bool:
        trial_id = log["trial_id"]
        if not self._updatable(trial_id, strict):
            self._skipped()
            return False
        state = int(log["state"])
        if state == RUNNING and self.state[trial_id] == RUNNING:  # taken by another process first
            self._skipped()
            return False
        self.state[trial_id] = state
        if self.full:
            trial = self.trials[trial_id]
            trial.state = state
            if state == RUNNING:
                trial.datetime_start = _local(log["datetime_start"])
            elif state in (COMPLETE, PRUNED, FAIL):
                trial.datetime_complete = _local(log["datetime_complete"])
            if log["values"] is not None:
                trial.values = list(log["values"])
        self._changed(trial_id)
        return True

    def _set_attrs(self, log: dict[str, Any], strict: bool, user: bool) -> None:
        trial_id = log["trial_id"]
        if not self._updatable(trial_id, strict):
            self._skipped()
            return None
        texts = log.get(TEXTS)  # (the values' JSON only, where a front made the log)
        attrs = log.get("user_attr" if user else "system_attr")
        if user:
            if "status" in (attrs if attrs is not None else texts):
                self.with_status.add(trial_id)
        else:
            self._note_system(trial_id, attrs if attrs is not None else
                              {key: json.loads(texts[key]) for key in texts if key in (HASH_ATTR, DUPLICATE_ATTR)})
        if self.full:
            trial = self.trials[trial_id]
            target = trial.user if user else trial.system
            if not user:
                trial.texts = None
            if texts is not None:
                target.update(texts)
            else:
                for key, value in attrs.items():
                    target[key] = json.dumps(value)
        self._changed(trial_id)
        return None

    # -- reads -------------------------------------------------------------------------------
    def study_trials(self, study_id: int) -> list[int]:
        """The study's trial ids by number (``KeyError``: no such study)."""
        if study_id not in self._live:
            raise KeyError(NOT_FOUND)
        return self._trial_ids[study_id]

    def changes(self, study_id: int, since: int, generation: str, user_attrs: Iterable[str] | None = None,
                form: str = "proto", unclaimed: bool = True) -> tuple[bytes, int]:
        """The study's trials changed since a cursor. ``full`` only.

        Args:
            study_id: the study.
            since: the cursor of the reader's last look.
            generation: the generation of that cursor (another's: every trial of the study).
            user_attrs: the user attributes to send (None: all).
            form: ``proto``: Optuna's ``GetTrialsReply``; ``json``: ``[DISTRIBUTIONS, TRIALS]``, TRIALS a JSON
                array of :meth:`Trial.json` arrays, DISTRIBUTIONS the object of the distributions they name
                (``{"ID": {NAME: DISTRIBUTION, ...}}``, each distribution in Optuna's JSON form, as a string).
            unclaimed: also the running trials that no claim tags yet (False: those are left out until they
                change again: a tuner's trials made ahead for its next asks carry nothing the others read).

        Returns:
            (the trials, the cursor to ask from next time). Each version of a trial is encoded once, whichever
            readers ask for it.
        """
        ids = self.study_trials(study_id)
        cursor = len(self.touched)
        if generation == self.generation and 0 <= since <= cursor:
            study_of = self.study_of
            ids = sorted({t for t in self.touched[since:cursor] if t >= 0 and study_of[t] == study_id})
        keep = None if user_attrs is None else frozenset(user_attrs)
        encoded = self._encoded.get((keep, form))
        if encoded is None:
            encoded = OrderedDict() if len(self._encoded) >= 8 else self._encoded.setdefault((keep, form), OrderedDict())
        parts = []
        sets: set[int] = set()
        if not unclaimed:
            state, tags = self.state, self.tags
            ids = [t for t in ids if state[t] != RUNNING or t in tags]
        for trial_id in ids:
            version = self._version.get(trial_id, 0)
            cached = encoded.get(trial_id)
            if cached is None or cached[0] != version:
                trial = self.trials[trial_id]
                if form == "json":
                    kept = self._set_of(trial.distributions)
                    cached = (version, trial.json(keep, kept).encode("utf-8"), kept)
                else:
                    data = trial.message(keep).SerializeToString()
                    cached = (version, TRIAL_FIELD + varint(len(data)) + data, -1)
                encoded[trial_id] = cached
            encoded.move_to_end(trial_id)  # (the latest used last)
            parts.append(cached[1])
            sets.add(cached[2])
        while len(encoded) > ENCODED_TRIALS_KEPT:  # (the least recently used go: O(1) each, unlike a dict's
            encoded.popitem(last=False)  # first key, found past every key deleted before it)
        if form == "json":
            table = b",".join(self._set_texts[i] for i in sorted(sets))
            return b"[{" + table + b"},[" + b",".join(parts) + b"]]", cursor
        return b"".join(parts), cursor

    def _set_of(self, distributions: dict[str, str]) -> int:
        """The id of a trial's distributions (the same for every trial with the same ones)."""
        key = tuple(distributions.items())
        found = self._sets.get(key)
        if found is None:
            found = self._sets[key] = len(self._set_texts)
            self._set_texts.append(f'"{found}":{_json(distributions)}'.encode("utf-8"))
        return found


class Trial:
    """A trial as a study server sends it (attribute values as their JSON text; times as the proxy's text)."""

    __slots__ = ("trial_id", "number", "state", "values", "datetime_start", "datetime_complete", "params",
                 "distributions", "user", "system", "intermediate", "texts")

    def __init__(self, trial_id: int, number: int, state: int, values: list[float], datetime_start: str,
                 datetime_complete: str, params: dict[str, float], distributions: dict[str, str],
                 user: dict[str, str], system: dict[str, str], intermediate: dict[int, float]) -> None:
        self.trial_id, self.number, self.state, self.values = trial_id, number, state, values
        self.datetime_start, self.datetime_complete = datetime_start, datetime_complete
        self.params, self.distributions = params, distributions
        self.user, self.system, self.intermediate = user, system, intermediate
        self.texts: tuple[str, str] | None = None  # the JSON of (params, system attributes) while they stay

    def message(self, keep: frozenset[str] | None = None) -> Any:
        """Optuna's proxy's ``Trial`` message (with only the user attributes in ``keep``; None: all)."""
        from optuna.storages._grpc.auto_generated import api_pb2

        return api_pb2.Trial(trial_id=self.trial_id, number=self.number, state=self.state, values=self.values,
                             datetime_start=self.datetime_start, datetime_complete=self.datetime_complete,
                             params=self.params, distributions=self.distributions,
                             user_attributes=_kept(self.user, keep), system_attributes=self.system,
                             intermediate_values=self.intermediate)

    def json(self, keep: frozenset[str] | None = None, distributions: int = -1) -> str:
        """``[trial id, number, state, values, start, end, params, distributions, user attributes, system
        attributes, intermediate values]`` as JSON: the parameters in their external form (a choice itself, an
        integer as an integer), ``distributions`` the id of the trial's distributions in its answer's table,
        the attributes as JSON objects of their values (a reader decodes a trial in one parse), the times as
        the proxy's."""
        # (the times are ``DATETIME_FORMAT`` or "": nothing in them is escaped)
        texts = self.texts
        if texts is None:
            texts = self.texts = (_json(_external(self.params, self.distributions)) if self.params else "{}",
                                  _object(self.system))
        return (f'[{self.trial_id},{self.number},{self.state},{_json(self.values) if self.values else "[]"},'
                f'"{self.datetime_start}","{self.datetime_complete}",{texts[0]},{distributions},'
                f"{_object(_kept(self.user, keep))},{texts[1]},"
                f"{_json({str(step): value for step, value in self.intermediate.items()}) if self.intermediate else '{}'}]")


def _external(params: dict[str, float], distributions: dict[str, str]) -> dict[str, Any]:
    """Parameters in Optuna's external form (what ``FrozenTrial.params`` holds)."""
    return {name: _distribution(distributions[name]).to_external_repr(value) for name, value in params.items()}


@functools.lru_cache(maxsize=1024)
def _distribution(text: str) -> Any:
    """Optuna's distribution of its JSON form (a study has few distinct ones)."""
    from optuna.distributions import json_to_distribution

    return json_to_distribution(text)


def _kept(attrs: dict[str, str], keep: frozenset[str] | None) -> dict[str, str]:
    return attrs if keep is None else {key: text for key, text in attrs.items() if key in keep}


def _object(texts: dict[str, str]) -> str:
    """A JSON object of values given as their JSON texts."""
    return "{" + ",".join(f"{_json(key)}:{text}" for key, text in texts.items()) + "}"




def _local(text: str | None) -> str:
    """A journal's UTC time as the proxy sends it (local time, ``DATETIME_FORMAT``; "" for none)."""
    if not text:
        return ""
    if len(text) == 32 and text[19] == "." and text.endswith("+00:00"):  # a front's (``isoformat``, UTC, in
        # microseconds): the local time of its second, found once a second, and its microseconds
        second = _SECONDS.get(text[:19])
        if second is None:
            if len(_SECONDS) > 4096:
                _SECONDS.clear()
            second = _SECONDS[text[:19]] = _converted(text[:19] + "+00:00", "seconds")
        return second + text[19:26]
    return _converted(text)


def _converted(text: str, timespec: str = "microseconds") -> str:
    moment = datetime.datetime.fromisoformat(text)
    quarter = int(moment.timestamp()) // 900  # (offsets change on quarter hours)
    offset = _OFFSETS.get(quarter)
    if offset is None:
        offset = moment.astimezone().utcoffset()
        if len(_OFFSETS) > 4096:
            _OFFSETS.clear()
        _OFFSETS[quarter] = offset
    local = (moment + offset).replace(tzinfo=None)
    return local.isoformat(sep=" ", timespec=timespec)


_SECONDS: dict[str, str] = {}  # a UTC second (``YYYY-MM-DDTHH:MM:SS``) -> its local time, as the proxy sends it
_OFFSETS: dict[int, datetime.timedelta] = {}  # quarter hour (UTC) -> the local offset then


def varint(value: int) -> bytes:
    """``value`` as a protocol buffers varint."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
