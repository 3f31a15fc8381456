"""Claims of configuration hashes in a shared study: which trial evaluates each, decided by the study server."""

from __future__ import annotations

import threading
from typing import Any


class Claims:
    """Which trial evaluates each configuration hash of each study, decided here, one call at a time.

    The first trial to claim a hash owns it while it is not released: FAIL without a ``status`` (a stopped
    tuner fails its running trials: the hash is free again; a configuration that failed is FAIL with its
    ``status`` and stays claimed); claims already in the study when the server starts (trials tagged
    ``mneme:hash``, not duplicates, not released, not WAITING) count, the lowest-numbered first, as tuners
    on a shared storage decide. A WAITING trial (an enqueued point, tagged when enqueued) claims when a tuner
    takes it. Every trial's claim, the WAITING ones' included, goes through here: every tuner of a study
    must go through this server for the claims to hold.

    Args:
        storage: the Optuna storage the claims are tagged in (:meth:`claim`).
        trials: what the decisions read of the study (``existing(study_id)``: hash -> owner trial id of the
            claims in it; ``released(trial_id)``); by default read from ``storage``.
    """

    def __init__(self, storage: Any = None, trials: Any = None) -> None:
        self.storage = storage
        self._trials = trials if trials is not None else _StorageTrials(storage)
        self._lock = threading.RLock()
        self._owners: dict[int, dict[str, int]] = {}  # study id -> hash -> trial id

    def decide(self, study_id: int, trial_id: int, key: str) -> int:
        """The id of the trial that owns ``key`` once ``trial_id`` claims it (``trial_id`` itself, or the
        earlier trial that holds it)."""
        with self._lock:
            owners = self._owners.get(study_id)
            if owners is None:
                owners = self._owners[study_id] = self._trials.existing(study_id)
            owner_id = owners.get(key)
            if owner_id is not None and owner_id != trial_id and self._trials.released(owner_id):
                owner_id = None
            if owner_id is None:
                owners[key] = owner_id = trial_id
            return owner_id

    def claim(self, study_id: int, trial_id: int, key: str) -> int:
        """Tag ``trial_id`` with ``key`` in the storage; the number of the trial that owns ``key`` (marking this
        one a duplicate of it when it is another)."""

        from tuner.strategies.shared_study import DUPLICATE_ATTR, HASH_ATTR

        with self._lock:
            owner_id = self.decide(study_id, trial_id, key)
            self.storage.set_trial_system_attr(trial_id, HASH_ATTR, key)
            if owner_id == trial_id:
                return self.storage.get_trial(trial_id).number
            owner_number = self.storage.get_trial(owner_id).number
            self.storage.set_trial_system_attr(trial_id, DUPLICATE_ATTR, owner_number)
            return owner_number


class _StorageTrials:
    """What :class:`Claims` reads of a study, from an Optuna storage."""

    def __init__(self, storage: Any) -> None:
        self.storage = storage

    def existing(self, study_id: int) -> dict[str, int]:
        from tuner.strategies.shared_study import DUPLICATE_ATTR, HASH_ATTR

        owners: dict[str, int] = {}
        for trial in self.storage.get_all_trials(study_id, deepcopy=False):  # by number
            key = trial.system_attrs.get(HASH_ATTR)
            if trial.state.name == "WAITING":  # tagged when enqueued: its claim is made when a tuner takes it
                continue
            if key is not None and DUPLICATE_ATTR not in trial.system_attrs and not _released(trial):
                owners.setdefault(key, trial._trial_id)
        return owners

    def released(self, trial_id: int) -> bool:
        return _released(self.storage.get_trial(trial_id))


def _released(trial: Any) -> bool:
    """A claim that no longer holds: FAIL without a ``status`` (its tuner stopped before an outcome); a
    configuration that failed is FAIL with its ``status`` and stays claimed."""
    return trial.state.name == "FAIL" and "status" not in trial.user_attrs
