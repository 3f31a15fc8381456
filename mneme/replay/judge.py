"""Judging a replay: what the engine compares, and the verdict its statistics give.

One job: from the device state and the policies (flags and files, then the
recording's annotations, then ``auto``'s derived bounds, else bitwise:
``tolerance.ToleranceOverrides.resolve``), the engine's comparisons of every
region with its expected epilogue (:func:`plan_checks`, after the launches
:func:`checked_launches` names); from the engine's statistics, the mismatch
report (:func:`mismatches`, 16 bytes replayed vs recorded at the first
difference), the bounds a verified result was within (:func:`verified_within`),
and the result's verdict fields (:func:`verdict`). The numbers of one
comparison are judged by ``tolerance.judge``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mneme.model.experiment import STATUS_FAILED_VERIFICATION, STATUS_VERIFIED
from mneme.replay.nondeterminism import DerivedTolerance, summarize
from mneme.replay.state import DeviceState
from mneme.replay.tolerance import ToleranceOverrides, deviation, engine_check, is_exact, judge, worse


@dataclass
class CheckPlan:
    """The engine's comparisons of one replay, and how each is judged.

    Attributes:
        checks: the engine's check tuples (``tolerance.engine_check``), one per region the code can touch.
        regions: (region, policy) of each check, in the same order.
        sources: where each region's policy came from, by region label (``verified_within``'s ``source``).
    """

    checks: list[tuple]
    regions: list[tuple[Any, Any]]
    sources: dict[str, str]


def plan_checks(
    state: DeviceState, homes: dict[int, int], overrides: ToleranceOverrides, derived: DerivedTolerance | None
) -> CheckPlan:
    """Every region compared with its expected epilogue, under the policy it resolves to.

    Args:
        state: the device state.
        homes: where the loaded module put the recorded globals (a global it lacks is not compared:
            the kernel cannot touch it).
        overrides: the policies that win over the recorded annotations.
        derived: ``auto``'s bounds (None: none).

    Returns:
        The plan.
    """
    checks, checked_regions, sources = [], [], {}
    policies = derived.policies if derived is not None else {}
    for r in state.regions:
        live = state.live_address(r, homes)
        if live is None:
            continue
        policy, source = overrides.resolve(r.name, r.recorded_base, r.policy, policies.get(r.label))
        checks.append(engine_check(live, r.expected.ptr, r.size, policy))
        checked_regions.append((r, policy))
        sources[r.label] = source
    return CheckPlan(checks, checked_regions, sources)


def checked_launches(launches: int, every_iteration: bool) -> list[int]:
    """The launches after which the state is compared: the first and the last, or every one.

    Args:
        launches: the launches of the replay.
        every_iteration: compare after every launch.

    Returns:
        Launch indices, ascending.
    """
    if every_iteration:
        return list(range(launches))
    return sorted({0, launches - 1})


def mismatches(plan: CheckPlan, out: dict, state: DeviceState, homes: dict[int, int],
               read_back: bool = True) -> list[dict[str, Any]]:
    """One entry per region that failed in any checked launch, with the first failing launch's numbers.

    A region that differs in the last checked launch also gets the 16 bytes at its first difference,
    replayed and recorded (``at_first_mismatch``), read back from the device.

    Args:
        plan: the replay's comparisons.
        out: the engine's output.
        state: the device state.
        homes: where the loaded module put the recorded globals.
        read_back: read the bytes at the first difference (a synchronous copy: it waits for everything
            enqueued on the device); False when the memory no longer holds this replay's output.

    Returns:
        The mismatch entries (``result.mismatches``); empty when every check passed.
    """
    failures: dict[int, dict[str, Any]] = {}
    failed_launches: dict[int, list[int]] = {}
    checked_regions = plan.regions
    for launch, per_check in zip(out["checked_launches"], out["checks"]):
        for i, ((region, policy), (stats, counters)) in enumerate(zip(checked_regions, per_check)):
            verdict_ = judge(policy, stats, counters, region.size)
            if verdict_.passed:
                continue
            failed_launches.setdefault(i, []).append(launch)
            if i not in failures:
                failures[i] = verdict_.report
    found = []
    for i, report in sorted(failures.items()):
        region, _ = checked_regions[i]
        entry = {
            "region": region.label,
            "kind": region.kind,
            "base": hex(region.recorded_base),
            "size": region.size,
            "failed_launches": failed_launches[i],
            "launches_checked": len(out["checked_launches"]),
            **report,
        }
        last = out["checked_launches"][-1]
        offset = report.get("first_mismatch_offset")
        if read_back and offset is not None and last in failed_launches[i]:
            live = state.live_address(region, homes)
            n = min(16, region.size - offset)
            entry["at_first_mismatch"] = {
                "replayed": state.ctx.download(live + offset, n).hex(),
                "recorded": state.ctx.download(region.expected.ptr + offset, n).hex(),
            }
        found.append(entry)
    return found


def first_launch_verified(found: list[dict[str, Any]]) -> bool:
    """Whether every failing region passed the first launch (later ones, on what earlier ones left, failed).

    Args:
        found: :func:`mismatches`' entries.

    Returns:
        True when no entry names launch 0.
    """
    return all(0 not in m["failed_launches"] for m in found)


def verified_within(plan: CheckPlan, out: dict, derived: DerivedTolerance | None) -> dict[str, Any]:
    """Per region judged with a tolerance: the bound used, where it came from, and the worst checked launch.

    Args:
        plan: the replay's comparisons.
        out: the engine's output.
        derived: ``auto``'s bounds, whose provenance an ``auto`` entry carries.

    Returns:
        ``result.verified_within``.
    """
    within: dict[str, Any] = {}
    for i, (region, policy) in enumerate(plan.regions):
        if policy.is_bitwise:
            continue
        worst = None
        for per_check in out["checks"]:
            stats, counters = per_check[i]
            worst = worse(worst, deviation(policy, stats, counters))
        worst = {k: v if not isinstance(v, float) or math.isfinite(v) else str(v) for k, v in (worst or {}).items()}
        entry = {"policy": policy.spec(), "source": plan.sources.get(region.label, ""),
                 "exact": is_exact(worst), "worst": worst}  # fmt: skip
        if entry["source"] == "auto" and derived is not None:
            entry["derived"] = derived.provenance()
        within[region.label] = entry
    return within


def baseline_findings(
    probe: DerivedTolerance | None, probe_error: str, found: list[dict[str, Any]], mode: str
) -> tuple[list[dict[str, Any]], str]:
    """What the recorded launch's own runs say, for a replay of the recorded launch.

    Args:
        probe: the baseline's repeated runs (None: they could not run).
        probe_error: why they could not.
        found: the replay's mismatches.
        mode: the verification mode (``exact`` results get a hint that ``auto`` verifies
            nondeterministic regions).

    Returns:
        (``result.nondeterminism``: the regions that were not exact in every run; what the error
        adds when the replay did not verify).
    """
    if probe is None:
        return [], (f"; {probe_error}" if found else "")
    nondeterminism = [f.to_dict() for f in probe.findings if f.classification != "exact"]
    if not (found and nondeterminism):
        return nondeterminism, ""
    hint = "" if mode == "auto" else "; nondeterministic regions verify with --tolerance auto"
    return nondeterminism, f"; the recorded launch replayed {probe.runs} times: {summarize(probe.findings)}{hint}"


def verdict(
    plan: CheckPlan,
    out: dict,
    found: list[dict[str, Any]],
    derived: DerivedTolerance | None,
    nondeterminism: list[dict[str, Any]] | None = None,
    note: str = "",
) -> dict[str, Any]:
    """The verdict fields of a replay's result.

    Args:
        plan: the replay's comparisons.
        out: the engine's output.
        found: its mismatches.
        derived: ``auto``'s bounds.
        nondeterminism: the baseline's findings (:func:`baseline_findings`), when it was the recorded launch.
        note: what the error adds (:func:`baseline_findings`).

    Returns:
        ``verified``, ``status``, ``mismatches``, ``error``, ``verified_within``, ``nondeterminism``.
    """
    verified = not found
    return {
        "verified": verified,
        "status": STATUS_VERIFIED if verified else STATUS_FAILED_VERIFICATION,
        "mismatches": found,
        "error": "" if verified else mismatch_summary(found) + note,
        "verified_within": verified_within(plan, out, derived) if verified else {},
        "nondeterminism": nondeterminism if nondeterminism is not None else [],
    }


def mismatch_summary(found: list[dict[str, Any]]) -> str:
    """The error of a replay that did not verify: per failing region what differed, and in which launches.

    Args:
        found: :func:`mismatches`' entries.

    Returns:
        ``verification failed: region ...; region ...``.
    """
    parts = []
    for m in found:
        if "same_multiset" in m:
            what = f"not the recorded multiset of {m['elements']} {m['policy']['dtype']} elements"
        elif "mismatched_bytes" in m:
            what = f"{m['mismatched_bytes']} of {m['size']} bytes differ (first at offset {m.get('first_mismatch_offset')})"
        elif "diff_norm" in m:
            what = f"{m['policy']['norm']} norm of the difference {m['diff_norm']:.3g} > {m['limit']:.3g}"
        else:
            ulp = f", {m['max_ulp']} ULP" if m.get("max_ulp") is not None else ""
            bound = f" > {m['policy']['threshold']:g} ULP" if m["policy"].get("mode") == "ulp" else ""
            what = (f"{m.get('mismatched_elements', '?')} of {m['elements']} elements outside tolerance "
                    f"(max abs diff {m['max_abs_diff']:.3g}{ulp}{bound})")
        parts.append(f"region {m['region']} ({m['kind']}): {what}; failed launches {m['failed_launches']}")
    return "verification failed: " + "; ".join(parts)
