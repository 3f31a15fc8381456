"""Nondeterministic kernels: classify what the recorded baseline's own runs show, derive bounds.

A kernel whose result depends on the order of floating-point atomics (a block
reduction finished with ``atomicAdd`` on a float, a histogram with float
weights) or whose output order depends on scheduling (an atomic-index stream
compaction) does not replay bit-exactly, not even the recorded launch. The
``Replayer`` replays the baseline ``runs`` times on the device (one engine
call, the memory reset before each launch) and gathers, per run and region,
the device statistics of ``compare_kernels.cu``: differing elements, ULP
distance, absolute and relative deviation, and multiset/positional hashes of
both sides. Nothing but those numbers comes back to the host.

This module is the pure policy over those numbers (CPU-tested on synthetic
statistics): the classification of each region, the bound ``--tolerance auto``
derives from the observed spread, the dtype guess, and the stored form with its
provenance (the ``<static>.tolerance.json`` sidecar beside the recording).

Classification of a region over the runs:

* ``exact``: every run bit-equal to the recorded epilogue;
* ``deterministic_mismatch``: every run gives the same bytes, and they are not
  the epilogue's: the replay is wrong (or the recording is), whatever the
  tolerance; no bound is derived and the region stays bitwise, so it fails;
* ``nondeterministic``: the runs differ from each other. ``permuted`` when
  every run holds the epilogue's multiset of elements in another order.

Derived policy (nondeterministic regions only): ``multiset`` for permuted
regions; otherwise ``ulp`` with ``safety x`` the largest ULP distance any run
showed (at least ``safety`` ULPs). Integers count ULPs as units.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from mneme.errors import ArtifactError
from mneme.format.policy import DTYPES, VerifyPolicy
from mneme.model.verification import DEFAULT_SAFETY
from mneme.replay.tolerance import (
    ACTUAL_MULTISET,
    ACTUAL_POSITIONAL,
    DIFFERING,
    EXPECTED_MULTISET,
    EXPECTED_POSITIONAL,
    MAX_ABS_DIFF,
    MAX_REL_DIFF,
    MAX_ULP,
    NAN_MISMATCH,
)

EXACT, DETERMINISTIC_MISMATCH, NONDETERMINISTIC = "exact", "deterministic_mismatch", "nondeterministic"
SIDECAR_FORMAT = 1

#: Element types of demangled C++ parameter types (pointers to them).
_CTYPES = {
    "float": "f32", "double": "f64", "__half": "f16", "half": "f16", "__nv_bfloat16": "bf16",
    "int": "i32", "unsigned int": "u32", "unsigned": "u32", "long": "i64", "long long": "i64",
    "unsigned long": "u64", "unsigned long long": "u64", "short": "i16", "unsigned short": "u16",
    "char": "i8", "signed char": "i8", "unsigned char": "u8", "bool": "u8",
    "int32_t": "i32", "uint32_t": "u32", "int64_t": "i64", "uint64_t": "u64",
}  # fmt: skip


# -- the dtype of a region ----------------------------------------------------------------------


def param_types(demangled: str) -> list[str]:
    """The parameter types of a demangled signature (``f(float const*, int)`` -> ``['float const*', 'int']``)."""
    start = demangled.find("(")
    if start < 0 or not demangled.endswith(")"):
        return []
    inner, depth, parts, current = demangled[start + 1 : -1], 0, [], ""
    for ch in inner:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current.strip())
    return parts


def pointee_dtype(ctype: str) -> str | None:
    """``float const*`` -> ``f32``; None when it is not a pointer to a known scalar."""
    text = ctype.strip()
    if not text.endswith("*") or text.count("*") != 1:
        return None
    base = re.sub(r"\b(const|volatile|__restrict__|__restrict|restrict)\b", " ", text[:-1])
    return _CTYPES.get(" ".join(base.split()))


def dtype_from_params(base: int, size: int, demangled: str, params: Sequence[tuple[int, int]], args: bytes) -> str | None:
    """The element type of the first pointer parameter pointing into ``[base, base+size)``."""
    types = param_types(demangled)
    if len(types) != len(params):
        return None
    for ctype, (offset, psize) in zip(types, params):
        dtype = pointee_dtype(ctype)
        if dtype is None or psize != 8 or offset + 8 > len(args):
            continue
        value = int.from_bytes(args[offset : offset + 8], "little")
        if base <= value < base + size and size % DTYPES[dtype] == 0:
            return dtype
    return None


def dtype_from_content(sample: bytes, size: int) -> str:
    """A guess from the recorded bytes: floats when most words have a plausible exponent (or are zero)."""
    import numpy as np

    if size % 4 == 0 and len(sample) >= 4:
        words = np.frombuffer(sample[: len(sample) // 4 * 4], dtype="<u4")
        exponent = (words >> 23) & 0xFF
        if np.mean((words & 0x7FFFFFFF == 0) | ((exponent > 127 - 40) & (exponent < 127 + 40))) >= 0.75:
            return "f32"
    if size % 8 == 0 and len(sample) >= 8:
        dwords = np.frombuffer(sample[: len(sample) // 8 * 8], dtype="<u8")
        exponent = (dwords >> np.uint64(52)) & np.uint64(0x7FF)
        zero = (dwords & np.uint64(0x7FFFFFFFFFFFFFFF)) == 0
        if np.mean(zero | ((exponent > 1023 - 100) & (exponent < 1023 + 100))) >= 0.75:
            return "f64"
    return "i32" if size % 4 == 0 else "u8"


# -- one run's numbers, one region's finding ---------------------------------------------------


@dataclass(frozen=True)
class RunStats:
    """What the device gathered for one region after one replayed launch."""

    differing: int  # elements whose bits differ from the epilogue
    max_ulp: int
    max_abs: float
    max_rel: float
    nan_mismatch: int
    multiset: tuple[int, int]  # hashes of this run's elements, in any order
    positional: int  # hash of this run's contents, order included
    expected_multiset: tuple[int, int]
    expected_positional: int

    @classmethod
    def from_engine(cls, stats: Sequence[float], counters: Sequence[int]) -> "RunStats":
        """From a typed check with hashes (``engine_check(..., hash_elem=...)``)."""
        return cls(
            int(counters[DIFFERING]), int(counters[MAX_ULP]), float(stats[MAX_ABS_DIFF]), float(stats[MAX_REL_DIFF]),
            int(counters[NAN_MISMATCH]), tuple(int(c) for c in counters[ACTUAL_MULTISET]),
            int(counters[ACTUAL_POSITIONAL]), tuple(int(c) for c in counters[EXPECTED_MULTISET]),
            int(counters[EXPECTED_POSITIONAL]),
        )  # fmt: skip

    @property
    def exact(self) -> bool:
        return self.differing == 0 and self.positional == self.expected_positional


@dataclass(frozen=True)
class RegionFinding:
    """One region over the baseline's runs: its class, and how far the runs strayed."""

    region: str
    kind: str
    base: str
    size: int
    dtype: str
    dtype_source: str  # "parameter type", "contents", "annotation"
    classification: str
    runs: int
    runs_differing: int  # runs whose bytes are not the epilogue's
    distinct_outputs: int  # different contents among the runs
    permuted: bool  # every differing run holds the epilogue's multiset in another order
    differing_elements: int  # the most in any run
    elements: int
    max_ulp: int
    max_abs_diff: float
    max_rel_diff: float
    nan_mismatches: int = 0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("max_abs_diff", "max_rel_diff"):
            if not math.isfinite(out[key]):
                out[key] = str(out[key])  # JSON has no inf
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RegionFinding":
        values = dict(data)
        for key in ("max_abs_diff", "max_rel_diff"):
            values[key] = float(values.get(key, 0.0))
        return cls(**values)

    def describe(self) -> str:
        where = f"region {self.region} ({self.dtype}, {self.elements} elements)"
        if self.classification == DETERMINISTIC_MISMATCH:
            return (f"{where}: all {self.runs} runs agree with each other but not with the recording "
                    f"({self.differing_elements} elements differ, max {self.max_ulp} ULP): a real mismatch, "
                    "not nondeterminism")
        if self.classification == NONDETERMINISTIC:
            what = "permuted (same multiset of values, another order)" if self.permuted else (
                f"max {self.max_ulp} ULP, abs {self.max_abs_diff:.3g}, rel {self.max_rel_diff:.3g}")
            return (f"{where}: nondeterministic: {self.distinct_outputs} different results in {self.runs} runs, "
                    f"{self.runs_differing} differ from the recording, up to {self.differing_elements} elements; "
                    f"{what}")
        return f"{where}: exact in all {self.runs} runs"


def classify(
    region: str, kind: str, base: int, size: int, dtype: str, dtype_source: str, runs: Sequence[RunStats]
) -> RegionFinding:
    """The finding for one region from its runs' statistics."""
    if not runs:
        raise ValueError("classify needs at least one run")
    differing = [r for r in runs if not r.exact]
    distinct = len({(r.positional, r.multiset) for r in runs})
    if not differing:
        classification = EXACT
    elif distinct == 1:
        classification = DETERMINISTIC_MISMATCH
    else:
        classification = NONDETERMINISTIC
    permuted = bool(differing) and all(r.multiset == r.expected_multiset for r in differing)
    return RegionFinding(
        region=region, kind=kind, base=hex(base), size=size, dtype=dtype, dtype_source=dtype_source,
        classification=classification, runs=len(runs), runs_differing=len(differing), distinct_outputs=distinct,
        permuted=permuted, differing_elements=max(r.differing for r in runs), elements=size // DTYPES[dtype],
        max_ulp=max(r.max_ulp for r in runs), max_abs_diff=max(r.max_abs for r in runs),
        max_rel_diff=max(r.max_rel for r in runs), nan_mismatches=max(r.nan_mismatch for r in runs),
    )  # fmt: skip


def derive_policy(finding: RegionFinding, safety: float = DEFAULT_SAFETY) -> VerifyPolicy | None:
    """The bound ``--tolerance auto`` gives a region; None keeps it bitwise (exact, or a real mismatch)."""
    if finding.classification != NONDETERMINISTIC:
        return None
    if finding.permuted:
        return VerifyPolicy(dtype=finding.dtype, mode="multiset")
    ulps = max(math.ceil(safety * finding.max_ulp), math.ceil(safety))
    return VerifyPolicy(dtype=finding.dtype, mode="ulp", threshold=float(ulps))


# -- the derived tolerance and where it is kept --------------------------------------------------


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class DerivedTolerance:
    """What ``--tolerance auto`` derived for one instance, with its provenance."""

    findings: list[RegionFinding]
    runs: int
    safety_factor: float
    derived_at: str = field(default_factory=now_iso)
    device: str = ""
    policies: dict[str, VerifyPolicy] = field(default_factory=dict)  # region label -> policy

    @classmethod
    def derive(cls, findings: list[RegionFinding], runs: int, safety: float, device: str = "") -> "DerivedTolerance":
        policies = {}
        for f in findings:
            policy = derive_policy(f, safety)
            if policy is not None:
                policies[f.region] = policy
        return cls(findings, runs, safety, device=device, policies=policies)

    @property
    def mismatched(self) -> list[RegionFinding]:
        return [f for f in self.findings if f.classification == DETERMINISTIC_MISMATCH]

    @property
    def nondeterministic(self) -> list[RegionFinding]:
        return [f for f in self.findings if f.classification == NONDETERMINISTIC]

    def provenance(self) -> dict[str, Any]:
        return {"derived": True, "derived_at": self.derived_at, "runs": self.runs,
                "safety_factor": self.safety_factor, "device": self.device}  # fmt: skip

    def describe(self) -> str:
        """One line: the bounds, or that nothing needed one."""
        if not self.policies:
            return f"no region needs a tolerance ({self.runs} runs of the baseline)"
        bounds = ", ".join(f"{label}={p.spec()}" for label, p in self.policies.items())
        return f"derived from {self.runs} runs of the baseline (safety x{self.safety_factor:g}): {bounds}"

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.provenance(),
            "policies": {label: p.to_dict() for label, p in self.policies.items()},
            "findings": [f.to_dict() for f in self.findings],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], what: str = "derived tolerance") -> "DerivedTolerance":
        try:
            return cls(
                findings=[RegionFinding.from_dict(f) for f in data.get("findings", [])],
                runs=int(data["runs"]),
                safety_factor=float(data["safety_factor"]),
                derived_at=str(data.get("derived_at", "")),
                device=str(data.get("device", "")),
                policies={str(k): VerifyPolicy.from_dict(v, f"{what}: {k}") for k, v in data["policies"].items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{what} is damaged ({type(exc).__name__}: {exc}); delete it to derive again") from None


def sidecar_name(database_name: str) -> str:
    """``<static>.json`` -> ``<static>.tolerance.json`` (not a database name: listings skip it)."""
    stem = database_name[:-5] if database_name.endswith(".json") else database_name
    return f"{stem}.tolerance.json"


def load_derived(store: Any, database_name: str, record_id: str) -> DerivedTolerance | None:
    """The stored derivation of ``record_id``, or None when there is none."""
    name = sidecar_name(database_name)
    try:
        if not store.exists(name):
            return None
        data = json.loads(store.get(name))
    except ValueError as exc:
        raise ArtifactError(f"{name} in {store.url} is not valid JSON ({exc}); delete it to derive again") from None
    entry = (data.get("instances") or {}).get(record_id) if isinstance(data, dict) else None
    return DerivedTolerance.from_dict(entry, f"{name} instance {record_id}") if entry else None


def save_derived(store: Any, database_name: str, record_id: str, derived: DerivedTolerance) -> str:
    """Add (replace) ``record_id``'s derivation in the sidecar; returns its name."""
    name = sidecar_name(database_name)
    data: dict[str, Any] = {"format": SIDECAR_FORMAT, "instances": {}}
    if store.exists(name):
        try:
            existing = json.loads(store.get(name))
            if isinstance(existing, dict) and isinstance(existing.get("instances"), dict):
                data["instances"] = existing["instances"]
        except ValueError:
            pass  # a damaged sidecar is replaced
    data["instances"][record_id] = derived.to_dict()
    store.put(name, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return name


def summarize(findings: Iterable[RegionFinding]) -> str:
    """The report's text: one clause per region that was not exact."""
    return "; ".join(f.describe() for f in findings if f.classification != EXACT)
