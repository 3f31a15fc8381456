"""From a replay result to the numbers the tuner ranks: metric, speedup, objective values.

A result counts only when the replay verified against the recorded epilogue.
Anything else gets no metric and the sampler is told a penalty (the worst
value in the objective's direction), so a configuration that computes the
wrong answer fast never looks like the best one.

The objectives (``--objective``): ``time`` (the ``--metric`` of the measured
launches, ns, minimized), ``speedup`` (baseline / metric, maximized),
``energy`` (joules per launch from the replay's energy window, minimized) and
``edp`` (energy-delay product: joules per launch x the metric in seconds,
minimized) and hardware counters (``dram_bytes``, ``achieved_occupancy``, any
raw CUPTI metric: the value the replay's profiler collected, minimized or
maximized as ``mneme.replay.metrics.objective_direction`` says); a
comma-separated list of ``time``, ``energy``, ``edp`` and counters
(``time,energy``, ``time,dram_bytes``) is a multi-objective run (``--sampler
nsga2``), whose ``best.json`` holds the Pareto front. NSGA-II given one
objective adds ``--secondary-objective`` (registers or binary size) as before.
"""

from __future__ import annotations

import difflib
import statistics
from dataclasses import dataclass
from typing import Sequence

from mneme.errors import ConfigurationError
from mneme.model.experiment import (
    STATUS_FAILED_VERIFICATION,
    STATUS_INTERNAL_ERROR,
    STATUS_VERIFIED,
    STATUSES,
    ExperimentResult,
)
from mneme.replay.metrics import CURATED, GROUPS, is_raw, objective_direction

#: The objectives ``--objective`` names, alone.
OBJECTIVES = ("time", "speedup", "energy", "edp")
#: Those a multi-objective list (``time,energy``) may combine: all minimized.
MULTI_OBJECTIVES = ("time", "energy", "edp")
#: Those that need the replays' energy window (``MeasurementSettings.energy``).
ENERGY_OBJECTIVES = frozenset({"energy", "edp"})
#: The second objective of a one-objective NSGA-II run (``--secondary-objective``).
SECONDARY_OBJECTIVES = ("registers", "binary-size")

_METRICS = {
    "mean": statistics.fmean,
    "median": statistics.median,
    "min": min,
    "max": max,
}


def metric_value(times: Sequence[int], metric: str) -> float:
    """The ``--metric`` statistic of the measured launch times (ns)."""
    return float(_METRICS[metric](times))


def objective_names(objective: str) -> tuple[str, ...]:
    """The objectives of ``--objective`` (``time``, or a list such as ``time,energy``).

    Args:
        objective: the setting.

    Returns:
        Their names, in order (whitespace and case ignored).
    """
    return tuple(part.strip().lower() for part in str(objective).split(",") if part.strip())


def is_counter(name: str) -> bool:
    """Whether an objective's name is a hardware counter's (a curated metric, a group, or a raw CUPTI name)."""
    return name not in OBJECTIVES and name not in SECONDARY_OBJECTIVES and (
        name in CURATED or name in GROUPS or is_raw(name))


def counter_names(objective: str) -> tuple[str, ...]:
    """The hardware counters ``--objective`` ranks by (``dram_bytes`` of ``time,dram_bytes``).

    Args:
        objective: the setting.

    Returns:
        Their names, in order (none for ``time``, ``speedup``, ``energy``, ``edp``).
    """
    return tuple(n for n in objective_names(objective) if is_counter(n))


def _counter_error(objective: str, name: str) -> str:
    """Why hardware counter ``name`` cannot be an objective ('' when it can)."""
    try:
        objective_direction(name)
    except ConfigurationError as exc:
        return f"--objective {objective!r}: {name}: {str(exc).removeprefix(f'--objective {name}: ')}"
    return ""


def objective_errors(objective: str) -> list[str]:
    """What is wrong with an ``--objective`` setting.

    Args:
        objective: the setting.

    Returns:
        The problems (empty when it is valid).
    """
    names = objective_names(objective)
    if not names:
        return [f"--objective {objective!r}: name one of {', '.join(OBJECTIVES)} or a list such as time,energy"]
    counters = [error for error in (_counter_error(objective, n) for n in names if is_counter(n)) if error]
    if counters:
        return counters
    if len(names) == 1:
        close = difflib.get_close_matches(names[0], [*OBJECTIVES, *CURATED], n=3)
        return [] if names[0] in OBJECTIVES or is_counter(names[0]) else [
            f"--objective {objective!r}: choose one of {', '.join(OBJECTIVES)}, a hardware counter (dram_bytes, "
            "achieved_occupancy, ...: mneme replay --list-metrics), or a list such as time,energy"
            + (f"; close names: {', '.join(close)}" if close else "")]
    wrong = [n for n in names if n not in MULTI_OBJECTIVES and not is_counter(n)]
    if wrong:
        return [f"--objective {objective!r}: a list of objectives combines {', '.join(MULTI_OBJECTIVES)} "
                f"(all minimized) and hardware counters, not {', '.join(wrong)}"]
    if len(set(names)) != len(names):
        return [f"--objective {objective!r} names an objective twice"]
    return []


def needs_energy(objective: str) -> bool:
    """Whether ``--objective`` needs the replays' energy window.

    Args:
        objective: the setting.

    Returns:
        True for ``energy``, ``edp`` and lists with either.
    """
    return bool(ENERGY_OBJECTIVES & set(objective_names(objective)))


def directions_of(names: Sequence[str]) -> tuple[str, ...]:
    """Optuna's directions of the objectives ``names``: ``speedup`` is maximized, a hardware counter as its
    metric is better (``achieved_occupancy`` up, ``dram_bytes`` down), the rest minimized.

    Args:
        names: objective names.

    Returns:
        ``minimize`` / ``maximize`` each.
    """
    return tuple("maximize" if n == "speedup" else objective_direction(n) if is_counter(n) else "minimize"
                 for n in names)


def energy_missing_reason(result: ExperimentResult) -> str:
    """Why a result carries no energy (``energy_j`` -1): what its conditions say.

    Args:
        result: a replay's result.

    Returns:
        The reason ('' when it carries energy).
    """
    if result.energy_j > 0:
        return ""
    conditions = result.conditions or {}
    energy = conditions.get("energy") or {}
    return (energy.get("error") or conditions.get("unavailable")
            or "the replay server did not measure it (one that predates energy measurement ignores the request)")


def effective_status(result: ExperimentResult) -> str:
    """The result's status; derived from the flags for results that carry none."""
    if result.status in STATUSES:
        if result.status == STATUS_VERIFIED and not result.verified:
            return STATUS_FAILED_VERIFICATION
        return result.status
    if result.verified and not result.failed:
        return STATUS_VERIFIED
    if result.executed:
        return STATUS_FAILED_VERIFICATION
    return STATUS_INTERNAL_ERROR


@dataclass(frozen=True)
class Outcome:
    """How one result scores."""

    status: str
    metric: float | None
    speedup: float | None
    values: tuple[float, ...] | None  # told to the sampler; None = failed (penalised)
    reason: str
    running: tuple[float, ...] = ()  # the metric after each measured launch (pruner input)


@dataclass(frozen=True)
class Objective:
    """``--metric``, ``--objective`` and, for NSGA-II, ``--secondary-objective``."""

    metric: str = "mean"
    objective: str = "time"  # one of OBJECTIVES, or a list of MULTI_OBJECTIVES ("time,energy")
    secondary: str | None = None  # "registers" | "binary-size" for one-objective NSGA-II runs
    baseline_metric: float | None = None

    def with_baseline(self, baseline_metric: float) -> "Objective":
        return Objective(self.metric, self.objective, self.secondary, baseline_metric)

    @classmethod
    def from_config(cls, config: dict) -> "Objective":
        """A run's objectives as its ``config.json`` (or resolved settings) gives them.

        Args:
            config: settings with ``metric``, ``objective``, ``sampler`` and ``secondary_objective``.

        Returns:
            The objective (no baseline metric).
        """
        nsga2 = config.get("sampler") == "nsga2"
        return cls(config.get("metric") or "mean", config.get("objective") or "time",
                   (config.get("secondary_objective") or "registers") if nsga2 else None)

    @property
    def names(self) -> tuple[str, ...]:
        """The objectives told to the sampler, in order (``time``, ``energy``, ..., ``registers``)."""
        names = objective_names(self.objective)
        return names + ((self.secondary,) if self.secondary and len(names) == 1 else ())

    @property
    def directions(self) -> tuple[str, ...]:
        """Optuna's direction of each objective."""
        return directions_of(self.names)

    @property
    def metric_names(self) -> list[str]:
        """The objectives' names in an Optuna study (``study.set_metric_names``): what the dashboard and
        the plots call each value."""
        return [self._metric_name(n) for n in self.names]

    def _metric_name(self, name: str) -> str:
        if is_counter(name):
            return name
        return {"time": f"{self.metric}_time_ns", "speedup": f"speedup_vs_baseline_{self.metric}",
                "energy": "energy_j_per_launch", "edp": f"edp_j_s_{self.metric}", "registers": "registers",
                "binary-size": "binary_size_bytes"}[name]

    @property
    def primary(self) -> str:
        """The first objective: what ``best.json``'s best is ranked by."""
        return self.names[0]

    def rank_value(self, record: dict) -> float:
        """What ranks a verified trial record under the first objective (lower is better).

        Args:
            record: a trial record with ``metric`` and ``objective_values``.

        Returns:
            The metric for ``time`` and ``speedup`` (a higher speedup is a lower metric), else the first
            objective value.
        """
        return rank_value(record, self.primary)

    def evaluate(self, result: ExperimentResult) -> Outcome:
        status = effective_status(result)
        times = result.measured_times
        if status != STATUS_VERIFIED:
            reason = result.error or f"replay ended with status {status}"
            return Outcome(status, None, None, None, reason)
        if not times or min(times) <= 0:
            return Outcome(STATUS_INTERNAL_ERROR, None, None, None,
                           f"verified replay reported no usable launch times ({result.exec_time})")
        metric = metric_value(times, self.metric)
        speedup = self.baseline_metric / metric if self.baseline_metric else None
        values: list[float] = []
        for name in self.names:
            value = _objective_value(name, result, metric, speedup)
            if value is None:
                why = (f"the replay did not measure energy: {energy_missing_reason(result)}" if name in ENERGY_OBJECTIVES
                       else f"the replay did not collect the hardware counter {name}: "
                       f"{result.metrics_error or 'the replay server did not profile (one that predates it)'}"
                       if is_counter(name) else f"the replay did not report {name} for the secondary objective")
                return Outcome(STATUS_INTERNAL_ERROR, metric, speedup, None, why)
            values.append(value)
        if self.names[0] in ENERGY_OBJECTIVES or is_counter(self.names[0]):
            return Outcome(status, metric, speedup, tuple(values), "", ())  # one value per replay: no pruning
        # the metric after each measured launch (the last is ``metric``, not computed again)
        running = tuple(metric_value(times[: i + 1], self.metric) for i in range(len(times) - 1)) + (metric,)
        if self.names[0] == "speedup" and self.baseline_metric:
            running = tuple(self.baseline_metric / r for r in running)
        return Outcome(status, metric, speedup, tuple(values), "", running)


def _objective_value(name: str, result: ExperimentResult, metric: float, speedup: float | None) -> float | None:
    """One objective's value of a verified result (None: the result does not carry it)."""
    if name == "time":
        return metric
    if name == "speedup":
        return speedup if speedup is not None else 1.0
    if name in ENERGY_OBJECTIVES:
        if not result.energy_j > 0:
            return None
        return result.energy_j if name == "energy" else result.energy_j * metric * 1e-9
    if is_counter(name):
        value = result.metrics.get(name)
        return None if value is None else float(value)
    value = result.reg_usage if name == "registers" else result.obj_size
    return None if value is None or value < 0 else float(value)


def rank_value(record: dict, primary: str = "time") -> float:
    """What ranks a verified trial record when ``primary`` is the first objective (lower is better).

    Args:
        record: a trial record with ``metric`` and ``objective_values``.
        primary: the first objective's name.

    Returns:
        The metric for ``time`` and ``speedup``, else the first objective value (``energy``, ``edp``, a hardware
        counter; negated for a counter that is better higher); ``inf`` for a record without it.
    """
    if primary in ENERGY_OBJECTIVES or is_counter(primary):
        values = record.get("objective_values") or []
        if not values or values[0] is None:
            return float("inf")
        return -float(values[0]) if is_counter(primary) and objective_direction(primary) == "maximize" \
            else float(values[0])
    return record["metric"]
