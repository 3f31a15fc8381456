"""A study server's trials in its JSON form, as Optuna's ``FrozenTrial``.

A tuner on a study server reads every version of every process's trials that changed since its last look,
so decoding them is most of what a trial costs it beyond its own, and the part that grows with the number
of tuners. The JSON form (``tuner.study_replica.StudyReplica.changes``) is made for a cheap decode: one
parse for a whole answer, attribute values and parameters already in the form ``FrozenTrial`` holds, and
each distinct set of distributions once per answer instead of once per trial.
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


def trials_of(answer: list[Any]) -> list[FrozenTrial]:
    """The trials of a JSON answer.

    Args:
        answer: ``[DISTRIBUTIONS, TRIALS]`` as parsed: ``{"ID": {NAME: DISTRIBUTION JSON}}`` and the trials'
            arrays ``[trial id, number, state, values, start, end, params, distributions id, user attributes,
            system attributes, intermediate values]``.

    Returns:
        The trials, in the answer's order.
    """
    table, rows = answer
    sets = {int(key): {name: _distribution(text) for name, text in texts.items()} for key, texts in table.items()}
    return [_trial(row, sets) for row in rows]


def _fields(row: list[Any], sets: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The attributes of the ``FrozenTrial`` of ``row``, as its constructor sets them."""
    trial_id, number, state, values, start, end, params, kept, user_attrs, system_attrs, steps = row
    return {"_number": number, "state": _STATES[state], "_values": values or None,
            "_datetime_start": _when(start) if start else None, "datetime_complete": _when(end) if end else None,
            "_params": params, "_user_attrs": user_attrs, "_system_attrs": system_attrs,
            "intermediate_values": {int(step): value for step, value in steps.items()} if steps else {},
            "_distributions": dict(sets[kept]), "_trial_id": trial_id}


def _constructed(row: list[Any], sets: dict[int, dict[str, Any]]) -> FrozenTrial:
    """The trial through ``FrozenTrial``'s constructor (where its attributes are not the ones expected)."""
    fields = _fields(row, sets)
    return FrozenTrial(number=fields["_number"], state=fields["state"], value=None, values=fields["_values"],
                       datetime_start=fields["_datetime_start"], datetime_complete=fields["datetime_complete"],
                       params=fields["_params"], distributions=fields["_distributions"],
                       user_attrs=fields["_user_attrs"], system_attrs=fields["_system_attrs"],
                       intermediate_values=fields["intermediate_values"], trial_id=fields["_trial_id"])


def _assembled(row: list[Any], sets: dict[int, dict[str, Any]]) -> FrozenTrial:
    """The trial with its attributes set at once (a third of the constructor's cost)."""
    trial = FrozenTrial.__new__(FrozenTrial)
    trial.__dict__ = _fields(row, sets)
    return trial


def _same_as_constructed() -> bool:
    """Whether the attributes :func:`_assembled` sets are exactly those the constructor sets (this Optuna's)."""
    row = [7, 3, TrialState.COMPLETE.value, [0.5], "2024-01-01 00:00:00.000001", "2024-01-01 00:00:01.000002",
           {"x": 2}, 0, {"a": 1}, {"b": [2]}, {"1": 0.25}]
    sets = {0: {"x": _distribution('{"name": "IntDistribution", "attributes": {"log": false, "step": 1, '
                                   '"low": 1, "high": 10}}')}}
    try:
        return _assembled(row, sets).__dict__ == _constructed(row, sets).__dict__
    except Exception:  # noqa: BLE001 - another Optuna: its constructor decides
        return False


_trial = _assembled if _same_as_constructed() else _constructed
