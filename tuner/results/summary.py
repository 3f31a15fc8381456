"""``best.json`` and ``summary.json``: what a run found, computed from all its trial records."""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from mneme.model.experiment import STATUSES
from tuner.objective import Objective
from tuner.results.directory import iter_verified
from tuner.results.spread import overlaps, result_spread


def rank_key(record: dict[str, Any]) -> float:
    """Lower is better; every objective ranks verified records by the metric (speedup = baseline / metric)."""
    return record["metric"]


def pareto_front(records: Sequence[dict[str, Any]], directions: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Verified records that no other record beats in every objective value.

    Args:
        records: trial records.
        directions: each objective value's direction (``minimize``/``maximize``); None: the first value is
            ranked by the metric (time or speedup) and the others minimized.

    Returns:
        The front, in the records' order.
    """
    points = [r for r in iter_verified(records) if r.get("objective_values")]

    def minimized(r: dict) -> list[float]:
        if directions is None:
            return [r["metric"], *r["objective_values"][1:]]
        return [-v if d == "maximize" else v for v, d in zip(r["objective_values"], directions)]

    def dominates(a: dict, b: dict) -> bool:
        va, vb = minimized(a), minimized(b)
        return all(x <= y for x, y in zip(va, vb)) and any(x < y for x, y in zip(va, vb))

    return [r for r in points if not any(dominates(o, r) for o in points if o is not r)]


def best_document(records: Sequence[dict[str, Any]], baseline: dict[str, Any] | None,
                  multi_objective: bool, *, objective: Objective | None = None) -> dict[str, Any]:
    """The best verified configuration (speedup against the current baseline), or why there is none.

    Args:
        records: the trial records.
        baseline: ``baseline.json``'s document, or None.
        multi_objective: add the Pareto front of the objective values (NSGA-II runs).
        objective: the run's objectives: the best is ranked by the first (None: by the metric), the front
            by all of them in their directions, the spread's metric is its ``--metric``.

    Returns:
        The document: ``best`` (with its launches' ``spread``, a bootstrap confidence interval of the
        metric, and ``overlaps_baseline``: the baseline's interval overlaps it), ``baseline_spread``,
        ``pareto_front``.
    """
    key = objective.rank_value if objective is not None else rank_key
    verified = sorted(iter_verified(records), key=key)
    baseline_metric = (baseline or {}).get("metric")
    metric = objective.metric if objective is not None else (baseline or {}).get("metric_name") or "mean"
    doc: dict[str, Any] = {"baseline_metric": baseline_metric}
    baseline_spread = result_spread((baseline or {}).get("result"), metric) if baseline else None
    if not verified:
        doc.update(best=None, reason="no candidate configuration verified")
        return doc
    best = verified[0]
    doc["best"] = _summary_of(best, baseline_metric)
    doc["best"]["spread"] = best_spread = result_spread(best.get("result"), metric)
    doc["best"]["overlaps_baseline"] = overlaps(best_spread, baseline_spread)
    doc["baseline_spread"] = baseline_spread
    if multi_objective:
        directions = objective.directions if objective is not None else None
        doc["pareto_front"] = [_summary_of(r, baseline_metric) for r in pareto_front(records, directions)]
        if objective is not None:
            doc["objectives"] = objective.metric_names
    return doc


def _summary_of(record: dict[str, Any], baseline_metric: float | None) -> dict[str, Any]:
    result = record.get("result") or {}
    measured = {name: result[name] for name in ("energy_j", "power_w") if (result.get(name) or -1) > 0}
    return {
        "trial": record["trial"],
        "hash": record["hash"],
        "params": record["params"],
        "configuration": record["configuration"],
        "metric": record["metric"],
        "speedup": baseline_metric / record["metric"] if baseline_metric else record.get("speedup"),
        "objective_values": record.get("objective_values"),
        "reg_usage": result.get("reg_usage"),
        "obj_size": result.get("obj_size"),
        "exec_time": result.get("exec_time"),
        **measured,
        "throttled": bool((result.get("conditions") or {}).get("throttled")),
        **({"metrics": record["metrics"]} if record.get("metrics") else {}),
    }


def is_exact(record: dict[str, Any]) -> bool:
    """A verified trial whose every region matched bit for bit (no tolerance was needed)."""
    within = (record.get("result") or {}).get("verified_within") or {}
    return all(entry.get("exact", False) for entry in within.values())


def verification_counts(records: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How many trials verified exactly, and how many only within a tolerance."""
    verified = [r for r in records if r.get("status") == "verified"]
    exact = sum(1 for r in verified if is_exact(r))
    return {"verified_exact": exact, "verified_within_tolerance": len(verified) - exact}


def summary_document(records: Sequence[dict[str, Any]], baseline: dict[str, Any] | None, *,
                     state: Any, options: dict[str, Any], elapsed_s: float, space_size: int | None,
                     coverage: dict[str, Any], objective: Objective | None = None) -> dict[str, Any]:
    """``summary.json``: counts, the best against the current baseline, why the run stopped and how much of
    the current space the directory holds.

    Args:
        records: every trial record of the directory (an earlier run's included).
        baseline: ``baseline.json``'s document, or None.
        state: the loop's state (``tuner.loop.LoopState``).
        options: the resolved settings.
        elapsed_s: the run's wall time.
        space_size: the number of points of the space (None: continuous).
        coverage: :func:`tuner.results.coverage.space_coverage` of the current space.
        objective: the run's objectives (their metric names, the spread's metric).

    Returns:
        The document. ``complete`` is true only when every configuration of the current space has a trial
        (or was settled by a block-shape ban); ``finished`` when the run stopped on its own terms (space,
        budget, or baseline only), not by a signal, ``--fail-fast`` or a failure.
    """
    counts = Counter(r["status"] for r in records)
    best_doc = best_document(records, baseline, multi_objective=False, objective=objective)
    best = best_doc.get("best")
    return {
        "trials": len(records),
        "evaluated_this_run": state.evaluated_now,
        "verified": counts.get("verified", 0),
        **verification_counts(records),
        "tolerance": {"mode": options.get("tolerance"), "explicit": options.get("tolerance_policies") or {},
                      **((baseline or {}).get("tolerance") or {})},
        "failed": len(records) - counts.get("verified", 0),
        "by_status": {s: counts.get(s, 0) for s in STATUSES},
        "skipped_resumed": state.resumed_skipped,
        "skipped_banned": state.banned_skipped,
        "banned_blocks": [list(b) for b in state.banned_blocks],
        "executor_errors": state.executor_errors,
        "baseline_metric": (baseline or {}).get("metric"),
        "best_metric": best["metric"] if best else None,
        "best_speedup": best["speedup"] if best else None,
        "best_trial": best["trial"] if best else None,
        **_trust(best, best_doc.get("baseline_spread"), records, baseline),
        "metric": options.get("metric"),
        "objective": options.get("objective"),
        "sampler": options.get("sampler"),
        "space_size": space_size,
        "stopped": state.stopped,
        "finished": state.stopped in ("exhausted", "budget", "baseline-only"),
        "complete": bool(coverage.get("complete")),
        "coverage": coverage,
        "elapsed_s": round(elapsed_s, 3),
    }


def _trust(best: dict[str, Any] | None, baseline_spread: dict[str, Any] | None, records: Sequence[dict[str, Any]],
           baseline: dict[str, Any] | None) -> dict[str, Any]:
    """``summary.json``'s measurement keys: the spreads of the best and the baseline, whether their intervals
    overlap, the trials measured while the GPU throttled, and the energies where they were measured."""
    base_result = (baseline or {}).get("result") or {}
    out: dict[str, Any] = {
        "best_spread": best.get("spread") if best else None,
        "baseline_spread": baseline_spread,
        "best_overlaps_baseline": best.get("overlaps_baseline") if best else None,
        "throttled_trials": sum(1 for r in records if ((r.get("result") or {}).get("conditions") or {}).get("throttled")),
        "baseline_throttled": bool((base_result.get("conditions") or {}).get("throttled")),
    }
    if (base_result.get("energy_j") or -1) > 0 or (best and "energy_j" in best):
        out["baseline_energy_j"] = base_result.get("energy_j") if (base_result.get("energy_j") or -1) > 0 else None
        out["best_energy_j"] = best.get("energy_j") if best else None
    return out
