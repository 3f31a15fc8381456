"""How much a configuration's measured launches vary, and whether the best is told apart from the baseline.

A replay measures a handful of launches; their metric (``--metric``: mean, median, min, max) is one number,
but the launches vary. ``best.json`` and ``summary.json`` give, for the best and for the baseline, the
standard deviation of the measured launch times and a bootstrap confidence interval of the metric: the
launches resampled with replacement ``RESAMPLES`` times (numpy, seeded: the same trials give the same
interval), the metric of each resample, and the central ``CONFIDENCE`` share of those (percentile
bootstrap). When the best's interval overlaps the baseline's, ``overlaps_baseline`` is true: with this
many launches the measurements do not tell the two apart, and the speedup may be noise.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0
#: Resampled launch times held at once (the resamples are drawn in chunks of at most this many values).
CHUNK_VALUES = 4_000_000

_STATISTICS = ("mean", "median", "min", "max")


def spread(times: Sequence[float], metric: str = "mean", *, confidence: float = CONFIDENCE,
           resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, Any]:
    """The spread of measured launch times and a bootstrap confidence interval of their ``metric``.

    Args:
        times: the measured launches' times (ns).
        metric: ``mean``, ``median``, ``min`` or ``max``.
        confidence: the interval's coverage (0.95: from the 2.5th to the 97.5th percentile).
        resamples: bootstrap resamples.
        seed: the resampling's seed.

    Returns:
        ``launches``, ``std_ns`` (the sample standard deviation), ``ci_ns`` ([low, high] of the metric),
        ``confidence``, ``resamples``, ``metric``; ``std_ns`` and ``ci_ns`` are None for fewer than two
        launches (one launch shows no spread).
    """
    import numpy as np

    if metric not in _STATISTICS:
        raise ValueError(f"metric {metric!r}: one of {', '.join(_STATISTICS)}")
    values = np.asarray([float(t) for t in times], dtype=np.float64)
    out: dict[str, Any] = {"launches": int(values.size), "std_ns": None, "ci_ns": None, "confidence": confidence,
                           "resamples": resamples, "metric": metric, "method": "percentile bootstrap"}
    if values.size < 2:
        return out
    out["std_ns"] = float(values.std(ddof=1))
    rng = np.random.default_rng(seed)
    statistic = getattr(np, metric)
    rows = max(1, CHUNK_VALUES // values.size)
    estimates = []
    for start in range(0, resamples, rows):
        count = min(rows, resamples - start)
        drawn = values[rng.integers(0, values.size, size=(count, values.size))]
        estimates.append(statistic(drawn, axis=1))
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(np.concatenate(estimates), [tail, 100.0 - tail])
    out["ci_ns"] = [float(low), float(high)]
    return out


def measured_times(result: Mapping[str, Any]) -> list[float]:
    """The measured launches (after the warm-ups) of a result's dict.

    Args:
        result: ``ExperimentResult.to_dict()`` (a trial record's or ``baseline.json``'s ``result``).

    Returns:
        Their times.
    """
    times = result.get("exec_time") or []
    return list(times[int(result.get("warmup") or 0):])


def result_spread(result: Mapping[str, Any] | None, metric: str) -> dict[str, Any] | None:
    """:func:`spread` of a result's measured launches (None without a result or launches).

    Args:
        result: a result's dict.
        metric: ``--metric``.

    Returns:
        The spread.
    """
    times = measured_times(result or {})
    return spread(times, metric) if times else None


def overlaps(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool | None:
    """Whether two spreads' confidence intervals overlap.

    Args:
        a: a :func:`spread`.
        b: another.

    Returns:
        True when they overlap (the measurements do not tell the two apart); None when either has no
        interval.
    """
    if not a or not b or not a.get("ci_ns") or not b.get("ci_ns"):
        return None
    (a0, a1), (b0, b1) = a["ci_ns"], b["ci_ns"]
    if any(not math.isfinite(v) for v in (a0, a1, b0, b1)):
        return None
    return a0 <= b1 and b0 <= a1
