"""A study server's trials in its JSON form, as Optuna's ``FrozenTrial``.

A tuner on a study server reads every version of every process's trials that changed since its last look,
so decoding them is most of what a trial costs it beyond its own, and the part that grows with the number
of tuners. The JSON form (``tuner.study_replica.StudyReplica.changes``) is made for a cheap decode: one
parse for a whole answer, attribute values and parameters already in the form ``FrozenTrial`` holds, and
each distinct set of distributions once per answer instead of once per trial. A row stays a row until a
``FrozenTrial`` of it is asked for: what a tuner reads of the others' trials (state, values, hash, claim,
status) is read off the row (:func:`outline`), and a random sampler asks for none of them.
"""

from __future__ import annotations

import datetime
import functools
from typing import Any

from optuna.distributions import json_to_distribution
from optuna.trial import FrozenTrial, TrialState

_STATES = {state.value: state for state in TrialState}
_when = datetime.datetime.fromisoformat
_distribution = functools.lru_cache(maxsize=1024)(json_to_distribution)  # a study has few distinct ones


def rows_of(answer: list[Any]) -> list[list[Any]]:
    """The rows of a JSON answer, each with its distributions in place of their id (the rows are changed in
    place: a row is an answer's own list). A row is a trial not made yet: :func:`trial_of` makes it, and
    :func:`outline` reads what a tuner looks at in each of the others' trials without making it.

    Args:
        answer: ``[DISTRIBUTIONS, TRIALS]`` as parsed: ``{"ID": {NAME: DISTRIBUTION JSON}}`` and the trials'
            arrays ``[trial id, number, state, values, start, end, params, distributions id, user attributes,
            system attributes, intermediate values]``.

    Returns:
        The rows, in the answer's order (the distributions of one id are one dictionary, not to be changed).
    """
    table, rows = answer
    sets = {int(key): {name: _distribution(text) for name, text in texts.items()} for key, texts in table.items()}
    for row in rows:
        row[7] = sets[row[7]]
    return rows


def trials_of(answer: list[Any]) -> list[FrozenTrial]:
    """The trials of a JSON answer (see :func:`rows_of`).

    Args:
        answer: ``[DISTRIBUTIONS, TRIALS]`` as parsed.

    Returns:
        The trials, in the answer's order.
    """
    return [_trial(row) for row in rows_of(answer)]


def trial_of(row: list[Any]) -> FrozenTrial:
    """The trial of a row of :func:`rows_of`.

    Args:
        row: the row.

    Returns:
        Its ``FrozenTrial``, which takes the row's dictionaries of parameters and attributes (make it once).
    """
    return _trial(row)


def state_of(entry: list[Any] | FrozenTrial) -> TrialState:
    """The state of a row of :func:`rows_of` or of a trial.

    Args:
        entry: the row or the trial.

    Returns:
        Its state.
    """
    return _STATES[entry[2]] if type(entry) is list else entry.state


def outline(entry: list[Any] | FrozenTrial) -> tuple[int, TrialState, list[float] | None, dict, dict]:
    """What a tuner reads of a trial of the study, of a row of :func:`rows_of` (without making its trial) or
    of a trial.

    Args:
        entry: the row or the trial.

    Returns:
        (number, state, values or None, system attributes, user attributes): the attributes are the trial's
        own dictionaries, not to be changed.
    """
    if type(entry) is list:
        return entry[1], _STATES[entry[2]], entry[3] or None, entry[9], entry[8]
    return entry.number, entry.state, entry.values, entry.system_attrs, entry.user_attrs


def _fields(row: list[Any]) -> dict[str, Any]:
    """The attributes of the ``FrozenTrial`` of ``row``, as its constructor sets them."""
    trial_id, number, state, values, start, end, params, kept, user_attrs, system_attrs, steps = row
    return {"_number": number, "state": _STATES[state], "_values": values or None,
            "_datetime_start": _when(start) if start else None, "datetime_complete": _when(end) if end else None,
            "_params": params, "_user_attrs": user_attrs, "_system_attrs": system_attrs,
            "intermediate_values": {int(step): value for step, value in steps.items()} if steps else {},
            "_distributions": dict(kept), "_trial_id": trial_id}


def _constructed(row: list[Any]) -> FrozenTrial:
    """The trial through ``FrozenTrial``'s constructor (where its attributes are not the ones expected)."""
    fields = _fields(row)
    return FrozenTrial(number=fields["_number"], state=fields["state"], value=None, values=fields["_values"],
                       datetime_start=fields["_datetime_start"], datetime_complete=fields["datetime_complete"],
                       params=fields["_params"], distributions=fields["_distributions"],
                       user_attrs=fields["_user_attrs"], system_attrs=fields["_system_attrs"],
                       intermediate_values=fields["intermediate_values"], trial_id=fields["_trial_id"])


def _assembled(row: list[Any]) -> FrozenTrial:
    """The trial with its attributes set at once (a third of the constructor's cost)."""
    trial = FrozenTrial.__new__(FrozenTrial)
    trial.__dict__ = _fields(row)
    return trial


def _same_as_constructed() -> bool:
    """Whether the attributes :func:`_assembled` sets are exactly those the constructor sets (this Optuna's)."""
    row = [7, 3, TrialState.COMPLETE.value, [0.5], "2024-01-01 00:00:00.000001", "2024-01-01 00:00:01.000002",
           {"x": 2}, {"x": _distribution('{"name": "IntDistribution", "attributes": {"log": false, "step": 1, '
                                         '"low": 1, "high": 10}}')}, {"a": 1}, {"b": [2]}, {"1": 0.25}]
    try:
        return _assembled(row).__dict__ == _constructed(row).__dict__
    except Exception:  # noqa: BLE001 - another Optuna: its constructor decides
        return False


_trial = _assembled if _same_as_constructed() else _constructed
