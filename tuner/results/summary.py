"""``best.json`` and ``summary.json``: what a run found, computed from all its trial records."""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from mneme.model.experiment import STATUSES
from tuner.results.directory import iter_verified


def rank_key(record: dict[str, Any]) -> float:
    """Lower is better; every objective ranks verified records by the metric (speedup = baseline / metric)."""
    return record["metric"]


def pareto_front(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Verified records that no other record beats in every objective value (all minimized or maximized as told)."""
    points = [r for r in iter_verified(records) if r.get("objective_values")]

    def dominates(a: dict, b: dict) -> bool:
        va = [a["metric"], *a["objective_values"][1:]]
        vb = [b["metric"], *b["objective_values"][1:]]
        return all(x <= y for x, y in zip(va, vb)) and any(x < y for x, y in zip(va, vb))

    return [r for r in points if not any(dominates(o, r) for o in points if o is not r)]


def best_document(records: Sequence[dict[str, Any]], baseline: dict[str, Any] | None,
                  multi_objective: bool) -> dict[str, Any]:
    """The best verified configuration (speedup against the current baseline), or why there is none."""
    verified = sorted(iter_verified(records), key=rank_key)
    baseline_metric = (baseline or {}).get("metric")
    doc: dict[str, Any] = {"baseline_metric": baseline_metric}
    if not verified:
        doc.update(best=None, reason="no candidate configuration verified")
        return doc
    best = verified[0]
    doc["best"] = _summary_of(best, baseline_metric)
    if multi_objective:
        doc["pareto_front"] = [_summary_of(r, baseline_metric) for r in pareto_front(records)]
    return doc


def _summary_of(record: dict[str, Any], baseline_metric: float | None) -> dict[str, Any]:
    result = record.get("result") or {}
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
                     coverage: dict[str, Any]) -> dict[str, Any]:
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

    Returns:
        The document. ``complete`` is true only when every configuration of the current space has a trial
        (or was settled by a block-shape ban); ``finished`` when the run stopped on its own terms (space,
        budget, or baseline only), not by a signal, ``--fail-fast`` or a failure.
    """
    counts = Counter(r["status"] for r in records)
    best = best_document(records, baseline, multi_objective=False).get("best")
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
