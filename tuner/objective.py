"""From a replay result to the numbers the tuner ranks: metric, speedup, objective values.

A result counts only when the replay verified against the recorded epilogue.
Anything else gets no metric and the sampler is told a penalty (the worst
value in the objective's direction), so a configuration that computes the
wrong answer fast never looks like the best one.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from mneme.model.experiment import (
    STATUS_FAILED_VERIFICATION,
    STATUS_INTERNAL_ERROR,
    STATUS_VERIFIED,
    STATUSES,
    ExperimentResult,
)

_METRICS = {
    "mean": statistics.fmean,
    "median": statistics.median,
    "min": min,
    "max": max,
}


def metric_value(times: Sequence[int], metric: str) -> float:
    """The ``--metric`` statistic of the measured launch times (ns)."""
    return float(_METRICS[metric](times))


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
    objective: str = "time"
    secondary: str | None = None  # "registers" | "binary-size" for multi-objective runs
    baseline_metric: float | None = None

    @property
    def metric_names(self) -> list[str]:
        """The objectives' names in an Optuna study (``study.set_metric_names``): what the dashboard and
        the plots call each value."""
        first = f"{self.metric}_time_ns" if self.objective == "time" else f"speedup_vs_baseline_{self.metric}"
        if self.secondary:
            return [first, "registers" if self.secondary == "registers" else "binary_size_bytes"]
        return [first]

    def with_baseline(self, baseline_metric: float) -> "Objective":
        return Objective(self.metric, self.objective, self.secondary, baseline_metric)

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
        primary = metric if self.objective == "time" else (speedup if speedup is not None else 1.0)
        values: tuple[float, ...] = (primary,)
        if self.secondary:
            secondary = result.reg_usage if self.secondary == "registers" else result.obj_size
            if secondary is None or secondary < 0:
                return Outcome(STATUS_INTERNAL_ERROR, metric, speedup, None,
                               f"the replay did not report {self.secondary} for the secondary objective")
            values = (primary, float(secondary))
        # the metric after each measured launch (the last is ``metric``, not computed again)
        running = tuple(metric_value(times[: i + 1], self.metric) for i in range(len(times) - 1)) + (metric,)
        if self.objective == "speedup" and self.baseline_metric:
            running = tuple(self.baseline_metric / r for r in running)
        return Outcome(status, metric, speedup, values, "", running)
