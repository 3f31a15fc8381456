"""The device side of nondeterminism detection: the recorded baseline replayed N times, once.

One engine call launches the baseline ``runs`` times, the written memory reset
before each launch, and compares every region with the recorded epilogue after
every launch on the device (typed statistics with ULP distance, plus multiset
and positional hashes of both sides): no region is copied to the host, and no
host round trip separates the runs. ``nondeterminism.classify`` judges the
numbers.
"""

from __future__ import annotations

from typing import Any

from mneme.format.policy import DTYPES, VerifyPolicy
from mneme.model.experiment import ExperimentConfiguration
from mneme.replay.launch import Launcher
from mneme.replay.launch_attrs import LaunchPlan
from mneme.replay.nondeterminism import (
    DerivedTolerance,
    RunStats,
    classify,
    dtype_from_content,
    dtype_from_params,
)
from mneme.replay.tolerance import engine_check

#: Bytes of a region's recorded contents read back to guess its element type, when no
#: annotation and no parameter type names it.
DTYPE_SAMPLE_BYTES = 64 * 1024


def region_dtype(launcher: Launcher, region: Any) -> tuple[str, str]:
    """(dtype, how it was found) for a region: annotation, kernel parameter type, or contents.

    Args:
        launcher: the instance's launcher (its recording, instance and context).
        region: the region (``state.RegionState``).

    Returns:
        The dtype and ``annotation``, ``parameter type`` or ``contents``.
    """
    policy = region.policy
    if policy is not None and not policy.is_bitwise and region.size % policy.element_size == 0:
        return policy.dtype, "annotation"
    kernel = launcher.recording.kernel
    params = [(p.offset, p.size) for p in kernel.params]
    found = dtype_from_params(region.recorded_base, region.size, kernel.demangled, params,
                              bytes(launcher.instance.arguments))  # fmt: skip
    if found:
        return found, "parameter type"
    sample = launcher.ctx.download(region.expected.ptr, min(region.size, DTYPE_SAMPLE_BYTES))
    return dtype_from_content(bytes(sample), region.size), "contents"


def probe_baseline(
    launcher: Launcher, baseline: ExperimentConfiguration, plan: LaunchPlan, runs: int, safety: float
) -> DerivedTolerance:
    """Replay the recorded launch ``runs`` times and classify each region.

    Args:
        launcher: the instance's launcher.
        baseline: the recorded launch as a configuration.
        plan: the recorded launch attributes.
        runs: how many launches.
        safety: ``auto``'s factor over the worst deviation seen.

    Returns:
        The findings and the bounds they give.

    Raises:
        Exception: what compiling or loading the baseline raises, and the engine's CudaError.
    """
    loaded = launcher.load(launcher.compile(baseline))
    launcher.set_dynamic_shared(loaded, baseline.shared_mem)
    state, homes = launcher.state, loaded.global_homes
    checks, meta = [], []
    for r in state.regions:
        live = state.live_address(r, homes)
        if live is None:
            continue
        dtype, source = region_dtype(launcher, r)
        policy = VerifyPolicy(dtype=dtype, mode="ulp", threshold=0.0)
        checks.append(engine_check(live, r.expected.ptr, r.size, policy, hash_elem=DTYPES[dtype]))
        meta.append((r, dtype, source))
    out = launcher.launch(loaded, baseline, runs, plan, resets=state.iteration_resets(homes), checks=checks,
                          check_launches=list(range(runs)), timed=False)  # fmt: skip
    findings = []
    for i, (r, dtype, source) in enumerate(meta):
        per_run = [RunStats.from_engine(*launch[i]) for launch in out["checks"]]
        findings.append(classify(r.label, r.kind, r.recorded_base, r.size, dtype, source, per_run))
    name = getattr(launcher.ctx, "name", "") or launcher.arch
    return DerivedTolerance.derive(findings, runs, safety, device=str(name))
