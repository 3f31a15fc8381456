"""Sampling strategies: how the points of a :class:`SearchSpace` are explored.

Every strategy speaks ask/tell: ``ask()`` returns the next :class:`Candidate`
(or None when it has nothing new to offer right now), ``tell(candidate,
values)`` reports the objective values of a finished candidate (``None``
values mean "failed": the trial is ``FAIL`` in the Optuna study, with the
configuration's status as a user attribute, and the sampler counts it among
the worst trials, :mod:`tuner.strategies.failures`, so a failure never looks
good to it). Iterating a strategy yields configurations, as the reference's
example does::

    for i, config in enumerate(ExhaustiveSamplingStrategy(space)):
        ...

Exhaustive enumeration is plain Python; random, TPE, grid and NSGA-II are
Optuna samplers behind the same interface. Strategies never evaluate the same
replay twice: points whose configurations have the same (grounded) hash are
answered from the values already told.
"""

from __future__ import annotations

import functools
import inspect
import math
import random
import warnings
from typing import Any, Iterator, Mapping, Sequence

from mneme.errors import ConfigurationError
from mneme.model.experiment import ExperimentConfiguration
from tuner.space.search_space import (
    Candidate,
    SearchSpace,
    baseline_params,
    constraints_checked,
    derive_checked,
    dimensions_of,
    iterate_points,
    space_size,
)
from tuner.strategies.failures import FAILED_ATTR, failures_as_worst

OPTUNA_SAMPLERS = ("random", "tpe", "grid", "nsga2")
PRUNERS = ("none", "median", "percentile", "hyperband", "successive-halving")
# How many duplicate draws ask() tolerates before saying "nothing new right now".
MAX_REDRAWS = 256
# After this many duplicate draws in one ask(), a finite space is searched for an unseen point.
ENQUEUE_AFTER = 32
#: System attribute of a trial that draws a configuration another trial evaluates: that trial's number
#: (its *claim*), or None when the claim is an earlier run's trial outside this study.
DUPLICATE_ATTR = "mneme:duplicate_of"


class _Draws:
    """The counts one ``ask_many`` keeps across its draws."""

    __slots__ = ("draw", "seen")

    def __init__(self) -> None:
        self.draw = 0  # draws since the last candidate (a claim lost with the batch counts as one)
        self.seen: int | None = None  # distinct configurations known, at most (counted again where it reaches the size)


def tell(study: Any, trial: Any, values: Any = None, state: Any = None) -> None:
    """``study.tell(trial, values, state=state)`` without its answer: Optuna's ``tell`` returns a deep copy of
    the trial (its user attributes and all), which cost a tenth of a tuner's CPU a trial and which nothing here
    reads. Through Optuna's own ``_tell_with_warning`` where it takes these arguments, else ``study.tell``."""
    told = _tell_function()
    if told is None:
        study.tell(trial, values, state=state)
    else:
        told(study=study, trial=trial, value_or_values=values, state=state)


@functools.lru_cache(maxsize=1)
def _tell_function() -> Any:
    try:
        from optuna.study._tell import _tell_with_warning
    except ImportError:
        return None
    parameters = inspect.signature(_tell_with_warning).parameters
    return _tell_with_warning if {"study", "trial", "value_or_values", "state"} <= parameters.keys() else None
#: User attribute of the trial that replays the baseline (enqueued first, ``study.enqueue_trial``).
BASELINE_ATTR = "baseline"
#: Status of a point the space's constraints exclude (a FAIL trial, never replayed).
EXCLUDED = "excluded_by_constraints"


class _Told:
    """What a configuration's trials are told when it did not give values: ``FAILED`` or ``PRUNED``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


FAILED = _Told("FAILED")
PRUNED = _Told("PRUNED")


class SamplingStrategy:
    """The interface every strategy implements."""

    directions: tuple[str, ...] = ("minimize",)

    def ask(self) -> Candidate | None:
        """The next candidate to evaluate.

        Returns:
            A ``Candidate``, or None when the strategy has no more.
        """
        raise NotImplementedError

    def ask_many(self, count: int) -> list[Candidate]:
        """Up to ``count`` candidates to evaluate (the loop's free places): a strategy on a shared study
        settles them with one call to its study server.

        Args:
            count: how many the loop takes now.

        Returns:
            The candidates; fewer (or none) when the strategy has no more for now.
        """
        out: list[Candidate] = []
        while len(out) < count:
            candidate = self.ask()
            if candidate is None:
                break
            out.append(candidate)
        return out

    def tell(self, candidate: Candidate, values: Sequence[float] | None,
             intermediate: Sequence[float] = (), *, status: str | None = None) -> bool:
        """Report a finished candidate; returns True when the strategy pruned it.

        Args:
            candidate: what :meth:`ask` returned.
            values: the objective values; None for a candidate without them.
            intermediate: the metric after each measured launch (the pruner's input).
            status: for ``values`` None, the configuration's status (``compile_error``, ...) when it failed
                (the one :meth:`annotate` gave, if it was called); None when it was not evaluated (the
                executor failed): a ``FAIL`` trial the sampler ignores, its configuration free to be asked
                again.

        Returns:
            True when the strategy pruned the trial.
        """
        return False

    def seed_history(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Teach the strategy trials of an earlier run (``--resume``); returns how many it took.

        Args:
            records: trial records of the earlier run (``trials.jsonl`` lines).

        Returns:
            How many it took.
        """
        return 0

    def annotate(self, candidate: Candidate, outcome: Any) -> None:
        """Attach a finished candidate's outcome (status, speedup, ...) before it is told; a shared
        study stores it as the trial's user attributes.

        Args:
            candidate: the candidate, as ``ask`` gave it.
            outcome: what the tuner knows of its result (status, speedup, ...).
        """

    def flush(self, upcoming: int | None = None) -> None:
        """The loop asks nothing more for now: send what the strategy holds back (a shared study's trial
        ends wait for its next call to the study server).

        Args:
            upcoming: the most candidates the loop will still ask for (None: no limit known); a strategy that
                draws ahead draws no more.
        """

    def close(self) -> None:
        """The run is over (finished, failed or interrupted): release what the strategy holds."""

    @property
    def penalty(self) -> tuple[float, ...]:
        """The values a failure counts as: the worst possible in each direction."""
        return tuple(math.inf if d == "minimize" else -math.inf for d in self.directions)

    def __iter__(self) -> Iterator[ExperimentConfiguration]:
        while True:
            candidate = self.ask()
            if candidate is None:
                return
            yield candidate.configuration
            self.tell(candidate, None)


class ExhaustiveSamplingStrategy(SamplingStrategy):
    """Every point of a finite space that passes ``constraints``, in grid order.

    Points deriving a configuration already produced (same grounded hash) are
    skipped, so each distinct replay appears once.

    Args:
        space: a finite search space.
    """

    def __init__(self, space: SearchSpace) -> None:
        size = space_size(space)
        if size is None:
            raise ConfigurationError(
                f"{type(space).__name__} has a continuous dimension; exhaustive search needs finite "
                "dimensions (give RealParam a step) or use --sampler random or tpe"
            )
        self.space = space
        self.size = size
        self._points = iterate_points(space)
        self._index = -1
        self._seen: set[str] = set()
        self.skipped_by_constraints = 0
        self.skipped_duplicates = 0

    def ask(self) -> Candidate | None:
        for params in self._points:
            self._index += 1
            if not constraints_checked(self.space, params):
                self.skipped_by_constraints += 1
                continue
            config = derive_checked(self.space, params)
            candidate = Candidate(params, config, self._index)
            if candidate.hash in self._seen:
                self.skipped_duplicates += 1
                continue
            self._seen.add(candidate.hash)
            return candidate
        return None


def make_pruner(name: str | None):
    """The Optuna pruner for ``--pruner NAME`` (None or 'none': no pruning).

    Args:
        name: ``--pruner``'s name: None, ``none``, or a pruner Optuna has.

    Returns:
        An ``optuna.pruners`` pruner.
    """
    import optuna

    name = (name or "none").lower()
    factories = {
        "none": optuna.pruners.NopPruner,
        "median": optuna.pruners.MedianPruner,
        "percentile": lambda: optuna.pruners.PercentilePruner(25.0),
        "hyperband": optuna.pruners.HyperbandPruner,
        "successive-halving": optuna.pruners.SuccessiveHalvingPruner,
    }
    if name not in factories:
        raise ConfigurationError(f"unknown pruner {name!r}; choose one of {', '.join(PRUNERS)}")
    return factories[name]()


def _grid_sampler_class():
    import optuna

    class AskTellGridSampler(optuna.samplers.GridSampler):
        """Optuna's grid sampler without its ``study.stop()`` when the grid is used up.

        That call only works inside ``study.optimize``; an ask/tell loop stops
        on the space size instead.
        """

        def after_trial(self, study, trial, state, values) -> None:
            return None

    return AskTellGridSampler


def _AskTellGridSampler(search_space, seed):
    return _grid_sampler_class()(search_space, seed=seed)


def make_sampler(name: str, space: SearchSpace, seed: int | None, n_objectives: int):
    """The Optuna sampler for ``--sampler NAME``.

    Args:
        name: ``random``, ``tpe``, ``nsga2`` or ``grid``.
        space: the search space (``grid`` enumerates it).
        seed: the sampler's seed.
        n_objectives: how many objectives the study has.

    Returns:
        An ``optuna.samplers`` sampler.
    """
    import optuna

    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "tpe":
        # constant_liar: the trials still replaying count as the worst value, so the candidates asked
        # for while many replay (the loop keeps the servers' capacity in flight) spread out.
        if n_objectives > 1:
            return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=16)
    if name == "grid":
        dims = dimensions_of(space)
        if space_size(space) is None:
            raise ConfigurationError("grid search needs finite dimensions (give RealParam a step)")
        return _AskTellGridSampler({n: p.values() for n, p in dims.items()}, seed=seed)
    raise ConfigurationError(
        f"unknown sampler {name!r}; choose one of random, tpe, grid, exhaustive, nsga2"
    )


class OptunaSamplingStrategy(SamplingStrategy):
    """Random, TPE, grid or NSGA-II sampling through an Optuna study (ask/tell).

    ``directions`` has one entry per objective ("minimize"/"maximize");
    NSGA-II takes two (time or speedup, plus registers or binary size). A
    persistent ``storage`` (an RDB URL) with ``study_name`` lets other tools
    inspect the study and a later run continue it.

    The study is what Optuna's tools expect: the objectives carry ``metric_names``; the baseline's point
    is enqueued as the first trial (user attribute ``baseline``); each evaluated trial carries the user
    attributes ``status``, ``speedup``, ``configuration`` and ``mneme`` (metric, hash, error); a failed
    configuration's trial is ``FAIL`` (:mod:`tuner.strategies.failures`); a trial that draws a
    configuration already evaluated or being evaluated is a duplicate, told that configuration's outcome,
    with ``mneme:duplicate_of`` naming the trial that evaluated it.

    Args:
        space: the search space.
        sampler: ``random``, ``tpe``, ``grid`` or ``nsga2``.
        seed: the sampler's seed (None: random).
        directions: ``minimize`` or ``maximize`` per objective.
        study_name: the study's name in ``storage``.
        storage: an Optuna storage URL (None: in memory).
        pruner: ``--pruner``'s name (None: no pruning).
        metric_names: one name per objective (the study's ``metric_names``).
        enqueue_baseline: enqueue the baseline's point as the first trial.

    Raises:
        ConfigurationError: an unknown sampler, a direction other than minimize/maximize, NSGA-II with one
            objective, or metric names that do not match.
    """

    def __init__(
        self,
        space: SearchSpace,
        sampler: str = "tpe",
        *,
        seed: int | None = None,
        directions: Sequence[str] = ("minimize",),
        study_name: str | None = None,
        storage: str | None = None,
        pruner: str | None = None,
        metric_names: Sequence[str] | None = None,
        enqueue_baseline: bool = True,
    ) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if sampler == "exhaustive":
            raise ConfigurationError("use ExhaustiveSamplingStrategy for exhaustive search")
        for d in directions:
            if d not in ("minimize", "maximize"):
                raise ConfigurationError(f"objective direction {d!r} must be 'minimize' or 'maximize'")
        if sampler == "nsga2" and len(directions) < 2:
            raise ConfigurationError("the nsga2 sampler is multi-objective: give it two directions")
        if metric_names is not None and len(metric_names) != len(directions):
            raise ConfigurationError(f"{len(directions)} objectives need as many metric names, got {metric_names}")
        self.space = space
        self.sampler_name = sampler
        self.directions = tuple(directions)
        self._dims = dimensions_of(space)
        self._distributions = {n: p.distribution() for n, p in self._dims.items()}
        self.size = space_size(space)
        base_sampler = make_sampler(sampler, space, seed, len(self.directions))
        self.study = optuna.create_study(
            storage=storage,
            sampler=failures_as_worst(base_sampler) if sampler == "tpe" else base_sampler,
            pruner=make_pruner(pruner) if len(self.directions) == 1 else None,
            study_name=study_name,
            directions=list(self.directions),
            load_if_exists=study_name is not None,
        )
        if metric_names is not None:
            with warnings.catch_warnings():  # experimental since Optuna 3.2
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                self.study.set_metric_names(list(metric_names))
        self._has_pruner = pruner not in (None, "none") and len(self.directions) == 1
        self._values: dict[str, Any] = {}  # hash -> told values (a tuple), FAILED or PRUNED
        self._failed: dict[str, str] = {}  # hash -> the status it failed with
        self._claim_of: dict[str, int | None] = {}  # hash -> number of the trial that evaluated it
        self._in_flight: dict[str, list[Any]] = {}  # hash -> duplicate trials waiting for its values
        self._trials: dict[int, Any] = {}  # candidate number -> optuna trial
        self._status: dict[int, str] = {}  # candidate number -> its status (annotate)
        self._rng = random.Random(seed)
        self._exhausted = False
        self._baseline_pending = enqueue_baseline
        self.skipped_by_constraints = 0
        self.skipped_duplicates = 0

    # -- ask/tell -------------------------------------------------------------
    def _distinct_seen(self) -> int:
        return len(self._values) + len(self._in_flight)

    def _is_known(self, key: str) -> bool:
        return key in self._values or key in self._in_flight

    def ask(self) -> Candidate | None:
        asked = self.ask_many(1)
        return asked[0] if asked else None

    def ask_many(self, count: int) -> list[Candidate]:
        """Up to ``count`` candidates: each draw that is not settled at once (a known configuration) is one;
        a draw whose claim is decided elsewhere (``_settled`` answers None: a study server) waits for the
        others of the batch, and those it loses are drawn again.

        Args:
            count: how many the loop takes now.

        Returns:
            The candidates; fewer (or none) when the space is used up or the sampler keeps proposing known
            points.
        """
        if self._baseline_pending:
            self._baseline_pending = False
            self._enqueue_baseline()
        out: list[Candidate] = []
        counters = _Draws()
        while len(out) < count:
            due = self._draw(count, out, counters)
            if not due:
                break
            won = self._decide(due)
            counters.seen = None  # (the study's news came with the claims)
            counters.draw += len(due) - len(won)
            out += won
        return out

    def _draw(self, count: int, out: list[Candidate], counters: "_Draws") -> list[tuple[Any, Candidate]]:
        """Draw until ``out`` and the draws whose claims are decided elsewhere (returned) make ``count``: a
        candidate settled here goes to ``out``."""
        due: list[tuple[Any, Candidate]] = []  # drawn, their claims decided together
        while len(out) + len(due) < count and counters.draw < MAX_REDRAWS:
            if self.size is not None and (counters.seen is None or counters.seen >= self.size):
                counters.seen = self._distinct_seen()
            if self._exhausted or (counters.seen is not None and counters.seen >= self.size):
                break
            if counters.draw == ENQUEUE_AFTER and self.size is not None and not self._enqueue_unseen_point():
                self._exhausted = True
                break
            counters.draw += 1
            trial = self.study.ask()
            params = {name: param.suggest(trial) for name, param in self._dims.items()}
            if not constraints_checked(self.space, params):
                self.skipped_by_constraints += 1
                self._fail(trial, EXCLUDED, mark=True)
                counters.seen = None
                continue
            candidate = Candidate(params, derive_checked(self.space, params), trial.number)
            settled = self._settled(trial, candidate)
            if settled:
                continue
            self._in_flight[candidate.hash] = []
            self._claim_of[candidate.hash] = trial.number
            counters.draw = 0
            if counters.seen is not None:
                counters.seen += 1
            if settled is None:
                due.append((trial, candidate))
                continue
            self._trials[trial.number] = trial
            out.append(candidate)
        return due

    def _decide(self, due: list[tuple[Any, Candidate]]) -> list[Candidate]:
        """The candidates of ``due`` whose claims this process won (only a shared study defers claims)."""
        raise NotImplementedError

    def _enqueue_baseline(self) -> None:
        """The baseline's point first (``study.enqueue_trial``), unless the study knows its configuration."""
        params = baseline_params(self.space)
        if params is None:
            return
        key = Candidate(params, derive_checked(self.space, params)).hash
        if not self._is_known(key):
            self._enqueue(params, key, {BASELINE_ATTR: True})

    def _enqueue(self, params: dict[str, Any], key: str, user_attrs: dict[str, Any] | None = None) -> None:
        """Enqueue the point ``params`` (configuration hash ``key``): the next ``study.ask`` takes it."""
        self.study.enqueue_trial(params, user_attrs=user_attrs)

    def _settled(self, trial: Any, candidate: Candidate) -> bool | None:
        """True when ``trial`` needs no replay of its own: its configuration's values are known (told now)
        or being measured (told when they come); None (a shared study): decided with the batch's other
        claims (``_decide``)."""
        key = candidate.hash
        if key in self._values:
            self.skipped_duplicates += 1
            self._mark_duplicate(trial, self._claim_of.get(key))
            self._tell_known(trial, key)
            return True
        if key in self._in_flight:
            self.skipped_duplicates += 1
            self._mark_duplicate(trial, self._claim_of.get(key))
            self._in_flight[key].append(trial)
            return True
        return False

    def _mark_duplicate(self, trial: Any, claim: int | None) -> None:
        self.study._storage.set_trial_system_attr(trial._trial_id, DUPLICATE_ATTR, claim)

    def _tell_known(self, trial: Any, key: str) -> None:
        """Tell a duplicate ``trial`` what its configuration's claim was told."""
        import optuna

        told = self._values[key]
        if told is FAILED:
            self._fail(trial, self._failed.get(key, "failed"), mark=True)
        elif told is PRUNED:
            tell(self.study, trial, state=optuna.trial.TrialState.PRUNED)
        else:
            tell(self.study, trial, list(told))

    def _fail(self, trial: Any, status: str | None, mark: bool = False) -> None:
        """``trial`` ends ``FAIL``; ``mark``: as a failed configuration's (``FAILED_ATTR``), which the
        sampler counts among the worst (an evaluated trial is marked by its ``status`` user attribute)."""
        import optuna

        if mark and status is not None:
            self.study._storage.set_trial_system_attr(trial._trial_id, FAILED_ATTR, status)
        tell(self.study, trial, state=optuna.trial.TrialState.FAIL)

    def _enqueue_unseen_point(self) -> bool:
        """The sampler keeps proposing known points (a nearly used-up space): hand it an unseen one.

        Returns False when every point of the space is known or in flight.
        """
        unseen = []
        for params in iterate_points(self.space):
            if not constraints_checked(self.space, params):
                continue
            key = Candidate(params, derive_checked(self.space, params)).hash
            if not self._is_known(key):
                unseen.append((params, key))
        if not unseen:
            return False
        self._enqueue(*self._rng.choice(unseen))
        return True

    def annotate(self, candidate: Candidate, outcome: Any) -> None:
        """User attributes of the evaluated trial (what optuna-dashboard shows beside its values).

        Args:
            candidate: the candidate, as ``ask`` gave it.
            outcome: what the tuner knows of its result (status, speedup, ...).
        """
        trial = self._trials.get(candidate.number)
        if trial is None:
            return
        self._status[candidate.number] = outcome.status
        self._set_user_attrs(trial, self._attributes(candidate, outcome))

    def _attributes(self, candidate: Candidate, outcome: Any) -> dict[str, Any]:
        speedup = outcome.speedup if outcome.speedup is None or math.isfinite(outcome.speedup) else None
        details = {"metric": outcome.metric, "hash": candidate.hash, "error": outcome.reason or ""}
        return {"status": outcome.status, "speedup": speedup, "configuration": candidate.configuration.to_dict(),
                "mneme": details}

    def _set_user_attrs(self, trial: Any, attrs: dict[str, Any]) -> None:
        for name, value in attrs.items():
            self.study._storage.set_trial_user_attr(trial._trial_id, name, value)

    def tell(self, candidate: Candidate, values: Sequence[float] | None,
             intermediate: Sequence[float] = (), *, status: str | None = None) -> bool:
        import optuna

        trial = self._trials.pop(candidate.number, None)
        if trial is None:
            raise ConfigurationError(f"candidate {candidate.number} was not asked from this strategy")
        status = self._status.pop(candidate.number, None) or status
        key = candidate.hash
        if values is None:
            waiting = self._in_flight.pop(key, [])
            if status is None:  # not evaluated: the configuration may be asked again
                self._claim_of.pop(key, None)
                for trial_ in [trial, *waiting]:
                    self._fail(trial_, None)
                return False
            if "status" not in trial.user_attrs:  # not annotated: the status as a user attribute here
                self.study._storage.set_trial_user_attr(trial._trial_id, "status", status)
            self._values[key], self._failed[key] = FAILED, status
            self._fail(trial, status)
            for waiting_trial in waiting:
                self._tell_known(waiting_trial, key)
            return False
        told = tuple(float(v) for v in values)
        if len(told) != len(self.directions):
            raise ConfigurationError(f"expected {len(self.directions)} objective values, got {len(told)}")
        pruned = False
        if self._has_pruner and intermediate:
            for step, value in enumerate(intermediate):
                trial.report(float(value), step)
            pruned = bool(trial.should_prune())
        if pruned:
            tell(self.study, trial, state=optuna.trial.TrialState.PRUNED)
        else:
            tell(self.study, trial, list(told))
        self._values[key] = told
        for waiting_trial in self._in_flight.pop(key, []):
            self._tell_known(waiting_trial, key)
        return pruned

    def seed_history(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Add earlier trials (records with ``params``, ``hash``, ``objective_values``, ``status``) to the
        study: failed ones as ``FAIL`` with their status.

        A study loaded from persistent storage already holds them; then only
        the duplicate cache is filled.

        Args:
            records: trial records of the earlier run (``trials.jsonl`` lines).

        Returns:
            How many trials it added.
        """
        import optuna

        add_to_study = len(self.study.get_trials(deepcopy=False)) == 0
        taken = 0
        for record in records:
            key = record.get("hash")
            params = record.get("params") or {}
            values = record.get("objective_values")
            failed = not values or any(v is None for v in values)
            if key:
                self._values[key] = FAILED if failed else tuple(values)
                if failed:
                    self._failed[key] = str(record.get("status") or "failed")
                self._claim_of[key] = None if add_to_study else record.get("sampler_trial")
            if not add_to_study or set(params) != set(self._distributions):
                continue
            if not all(self._dims[n].contains(v) for n, v in params.items()):
                continue
            attrs = {"status": record.get("status") or ("failed" if failed else "verified")}
            self.study.add_trial(optuna.trial.create_trial(
                params=dict(params), distributions=self._distributions, user_attrs=attrs,
                state=optuna.trial.TrialState.FAIL if failed else optuna.trial.TrialState.COMPLETE,
                values=None if failed else list(values)))
            if key:
                self._claim_of[key] = taken  # the study's trial numbers: 0, 1, ... as they are added
            taken += 1
        return taken
