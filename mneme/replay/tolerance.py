"""Verification policies at replay time: which policy applies to a region, and the verdict.

The engine gathers statistics on the device (``compare_kernels.cu``); this
module turns them into pass/fail and a mismatch report, and reads the
replay-time overrides users give (``--tolerance SEL=dtype:mode:threshold[:norm]``
flags, or a JSON file ``{"SEL": {"dtype": .., "mode": .., "threshold": .., "norm": ..}}``).
``SEL`` is a region name, its recorded base address (``0x7f0000000000``), or
``*`` for every region without a more specific entry.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from mneme.errors import ArtifactError, ConfigurationError
from mneme.format.policy import DTYPES, MODES, NORMS, VerifyPolicy

#: dtype codes of the engine's tolerance kernels (native/engine/engine.cpp kDtypes).
DTYPE_CODES = {
    "u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "u64": 6, "i64": 7,
    "f16": 8, "bf16": 9, "f32": 10, "f64": 11,
}  # fmt: skip
BYTEWISE_CODE = -1

# Slots of the engine's statistics (compare_kernels.cu).
SUM_ABS_DIFF, SUM_SQ_DIFF, MAX_ABS_DIFF, SUM_ABS_REF, SUM_SQ_REF, MAX_ABS_REF, MAX_REL_DIFF = range(7)
VIOLATIONS, FIRST_VIOLATION, NAN_MISMATCH = range(3)
NO_INDEX = 2**64 - 1


@dataclass(frozen=True)
class ToleranceOverrides:
    """Replay-time policies by region selector (name, base address, or ``*``)."""

    by_name: Mapping[str, VerifyPolicy]
    by_base: Mapping[int, VerifyPolicy]
    default: VerifyPolicy | None = None

    @classmethod
    def empty(cls) -> "ToleranceOverrides":
        return cls({}, {}, None)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], what: str = "tolerance overrides") -> "ToleranceOverrides":
        """From ``{selector: policy}`` where a policy is a dict or a ``dtype:mode:threshold[:norm]`` string."""
        if not isinstance(data, Mapping):
            raise ConfigurationError(f"{what}: expected an object mapping region names or bases to policies")
        by_name: dict[str, VerifyPolicy] = {}
        by_base: dict[int, VerifyPolicy] = {}
        default = None
        for selector, value in data.items():
            policy = _policy(value, f"{what}: {selector}")
            selector = str(selector).strip()
            if selector == "*":
                default = policy
            elif selector.lower().startswith("0x"):
                try:
                    by_base[int(selector, 16)] = policy
                except ValueError:
                    raise ConfigurationError(f"{what}: {selector!r} is not a hex base address") from None
            elif selector:
                by_name[selector] = policy
            else:
                raise ConfigurationError(f"{what}: empty region selector; use a region name, a 0x base or '*'")
        return cls(by_name, by_base, default)

    @classmethod
    def parse(cls, flags: Iterable[str] = (), files: Iterable[str | Path] = ()) -> "ToleranceOverrides":
        """From JSON files (in order) then ``SEL=spec`` flags; later entries win."""
        merged: dict[str, Any] = {}
        for path in files:
            try:
                data = json.loads(Path(path).read_text(encoding="utf-8"))
            except OSError as exc:
                raise ConfigurationError(f"cannot read the tolerance file {path}: {exc.strerror}") from None
            except ValueError as exc:
                raise ConfigurationError(f"the tolerance file {path} is not valid JSON ({exc})") from None
            if not isinstance(data, dict):
                raise ConfigurationError(f"the tolerance file {path} must hold a JSON object {{selector: policy}}")
            cls.from_mapping(data, f"tolerance file {path}")  # validate with the file named
            merged.update(data)
        for flag in flags:
            selector, sep, spec = flag.partition("=")
            if not sep or not selector.strip():
                raise ConfigurationError(
                    f"--tolerance {flag!r}: expected NAME_OR_BASE=dtype:mode:threshold[:norm], "
                    "e.g. c=f32:relative:1e-6 or '*=f64:absolute:1e-9:linf'"
                )
            merged[selector.strip()] = spec
        return cls.from_mapping(merged)

    def policy_for(self, name: str, base: int, recorded: VerifyPolicy | None) -> VerifyPolicy:
        """The policy of a region: by name, then by base, then ``*``, then the recorded one, else bitwise."""
        if name and name in self.by_name:
            return self.by_name[name]
        if base in self.by_base:
            return self.by_base[base]
        if self.default is not None:
            return self.default
        return recorded or VerifyPolicy()

    def unused_selectors(self, regions: Iterable[tuple[str, int]]) -> list[str]:
        """Selectors that match no region (most likely a typo the user wants to hear about)."""
        names = set()
        bases = set()
        for name, base in regions:
            names.add(name)
            bases.add(base)
        unused = [n for n in self.by_name if n not in names]
        unused += [hex(b) for b in self.by_base if b not in bases]
        return unused

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {n: p.to_dict() for n, p in self.by_name.items()}
        out.update({hex(b): p.to_dict() for b, p in self.by_base.items()})
        if self.default is not None:
            out["*"] = self.default.to_dict()
        return out


def _policy(value: Any, what: str) -> VerifyPolicy:
    if isinstance(value, VerifyPolicy):
        return value
    try:
        if isinstance(value, str):
            return parse_policy_spec(value)
        return VerifyPolicy.from_dict(value, what)
    except ArtifactError as exc:
        raise ConfigurationError(str(exc)) from None


def parse_policy_spec(spec: str) -> VerifyPolicy:
    """``bitwise`` or ``dtype:mode:threshold[:norm]`` (``f32:relative:1e-6:l2``)."""
    parts = [p.strip().lower() for p in spec.split(":")]
    if parts == ["bitwise"]:
        return VerifyPolicy()
    if len(parts) not in (3, 4):
        raise ConfigurationError(
            f"tolerance {spec!r}: expected dtype:mode:threshold[:norm] (dtype one of {', '.join(DTYPES)}; "
            f"mode one of {', '.join(MODES)}; norm one of {', '.join(NORMS)}) or 'bitwise'"
        )
    dtype, mode, threshold = parts[:3]
    norm = parts[3] if len(parts) == 4 else "none"
    try:
        value = float(threshold)
    except ValueError:
        raise ConfigurationError(f"tolerance {spec!r}: threshold {threshold!r} is not a number") from None
    try:
        return VerifyPolicy(dtype=dtype, mode=mode, threshold=value, norm=norm)
    except ArtifactError as exc:
        raise ConfigurationError(f"tolerance {spec!r}: {exc}") from None


# -- the check a policy asks the engine for, and the verdict on its statistics -----------------


def engine_check(actual: int, expected: int, size: int, policy: VerifyPolicy) -> tuple:
    """The engine's check tuple (actual, expected, size, dtype code, relative, threshold)."""
    if policy.is_bitwise:
        return (actual, expected, size, BYTEWISE_CODE, False, 0.0)
    if size % policy.element_size:
        raise ConfigurationError(
            f"a {size}-byte region cannot be compared as {policy.dtype} ({policy.element_size}-byte elements)"
        )
    # With a norm, the elementwise counters are informational; the threshold applies to the norm.
    return (actual, expected, size, DTYPE_CODES[policy.dtype], policy.mode == "relative", float(policy.threshold))


@dataclass(frozen=True)
class Verdict:
    passed: bool
    report: dict[str, Any]


def judge(policy: VerifyPolicy, stats: tuple[float, ...], counters: tuple[int, ...], size: int) -> Verdict:
    """Pass or fail one region from the engine's statistics, with the numbers a report needs."""
    if policy.is_bitwise:
        differing = int(counters[0])
        report: dict[str, Any] = {"policy": "bitwise", "mismatched_bytes": differing}
        if differing:
            report["first_mismatch_offset"] = int(counters[1])
        return Verdict(differing == 0, report)
    elements = size // policy.element_size
    violations, first, nan_mismatch = int(counters[VIOLATIONS]), int(counters[FIRST_VIOLATION]), int(counters[NAN_MISMATCH])
    report = {
        "policy": policy.to_dict(),
        "elements": elements,
        "max_abs_diff": stats[MAX_ABS_DIFF],
        "max_rel_diff": stats[MAX_REL_DIFF],
    }
    if nan_mismatch:
        report["nan_mismatches"] = nan_mismatch
    if policy.norm == "none":
        report["mismatched_elements"] = violations
        if violations:
            report["first_mismatch_offset"] = first * policy.element_size
        return Verdict(violations == 0, report)
    diff_norm, ref_norm = norms(policy.norm, stats)
    limit = policy.threshold * ref_norm if policy.mode == "relative" else policy.threshold
    report["diff_norm"] = diff_norm
    report["limit"] = limit
    if policy.mode == "relative":
        report["reference_norm"] = ref_norm
    passed = nan_mismatch == 0 and math.isfinite(diff_norm) and diff_norm <= limit
    return Verdict(passed, report)


def norms(norm: str, stats: tuple[float, ...]) -> tuple[float, float]:
    """(norm of the difference, norm of the recorded values) from the device statistics."""
    if norm == "l1":
        return stats[SUM_ABS_DIFF], stats[SUM_ABS_REF]
    if norm == "l2":
        return math.sqrt(stats[SUM_SQ_DIFF]), math.sqrt(stats[SUM_SQ_REF])
    if norm == "linf":
        return stats[MAX_ABS_DIFF], stats[MAX_ABS_REF]
    raise ConfigurationError(f"norm {norm!r} is not one of l1, l2, linf")
