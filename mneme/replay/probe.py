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


def region_dtype(replayer: Any, region: Any) -> tuple[str, str]:
    """(dtype, how it was found) for a region: annotation, kernel parameter type, or contents."""
    policy = region.policy
    if policy is not None and not policy.is_bitwise and region.size % policy.element_size == 0:
        return policy.dtype, "annotation"
    kernel = replayer.recording.kernel
    params = [(p.offset, p.size) for p in kernel.params]
    found = dtype_from_params(region.recorded_base, region.size, kernel.demangled, params,
                              bytes(replayer.instance.arguments))  # fmt: skip
    if found:
        return found, "parameter type"
    sample = replayer.ctx.download(region.expected.ptr, min(region.size, DTYPE_SAMPLE_BYTES))
    return dtype_from_content(bytes(sample), region.size), "contents"


def probe_baseline(replayer: Any, runs: int, safety: float) -> DerivedTolerance:
    """Replay the recorded launch ``runs`` times and classify each region; raises on driver errors."""
    baseline = replayer.baseline()
    loaded = replayer._load(replayer.compile(baseline))
    replayer._set_dynamic_shared(loaded, baseline.shared_mem)
    state, homes = replayer._state, loaded.global_homes
    checks, meta = [], []
    for r in state.regions:
        live = state.live_address(r, homes)
        if live is None:
            continue
        dtype, source = region_dtype(replayer, r)
        policy = VerifyPolicy(dtype=dtype, mode="ulp", threshold=0.0)
        checks.append(engine_check(live, r.expected.ptr, r.size, policy, hash_elem=DTYPES[dtype]))
        meta.append((r, dtype, source))
    state.apply_map(state.relocation_map(homes))
    state.full_reset(homes)
    out = loaded.function.run(
        baseline.grid.as_tuple(), baseline.block.as_tuple(), baseline.shared_mem, loaded.args, runs,
        resets=state.iteration_resets(homes), checks=checks, check_launches=list(range(runs)),
        timeout_s=replayer.timeout_s, attributes=list(replayer.launch_plan.attributes),
        param_offsets=loaded.param_offsets,
    )  # fmt: skip
    findings = []
    for i, (r, dtype, source) in enumerate(meta):
        per_run = [RunStats.from_engine(*launch[i]) for launch in out["checks"]]
        findings.append(classify(r.label, r.kind, r.recorded_base, r.size, dtype, source, per_run))
    name = getattr(replayer.ctx, "name", "") or replayer.arch
    return DerivedTolerance.derive(findings, runs, safety, device=str(name))
