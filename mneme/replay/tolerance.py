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
from mneme.format.policy import DTYPES, NORMS, VerifyPolicy
from mneme.format.policy import MODES as POLICY_MODES
from mneme.model.verification import DEFAULT_RUNS, MODES, VerificationSettings

#: dtype codes of the engine's tolerance kernels (native/engine/engine.cpp kDtypes).
DTYPE_CODES = {
    "u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "u64": 6, "i64": 7,
    "f16": 8, "bf16": 9, "f32": 10, "f64": 11,
}  # fmt: skip
BYTEWISE_CODE = -1
#: Element violation tests of the tolerance kernels (compare_kernels.cu MODE_*).
MODE_CODES = {"absolute": 0, "relative": 1, "ulp": 2}

# Slots of the engine's statistics (compare_kernels.cu): 7 doubles; then 5 counters, and the
# hashes of the actual side (multiset, second multiset, positional) and of the expected side.
SUM_ABS_DIFF, SUM_SQ_DIFF, MAX_ABS_DIFF, SUM_ABS_REF, SUM_SQ_REF, MAX_ABS_REF, MAX_REL_DIFF = range(7)
VIOLATIONS, FIRST_VIOLATION, NAN_MISMATCH, DIFFERING, MAX_ULP = range(5)
ACTUAL_MULTISET, ACTUAL_POSITIONAL, EXPECTED_MULTISET, EXPECTED_POSITIONAL = slice(5, 7), 7, slice(8, 10), 10
NO_INDEX = 2**64 - 1
COUNTER_WORDS = 11  # 5 counters + 6 hashes

#: Where a region's policy came from (``verified_within`` names it).
SOURCE_FLAG, SOURCE_RECORDED, SOURCE_AUTO, SOURCE_DEFAULT = "flag", "recorded", "auto", "bitwise default"
#: The verification modes: recorded annotations else bitwise, or also bounds derived for nondeterministic regions.
TOLERANCE_MODES = MODES


@dataclass(frozen=True)
class ToleranceOverrides:
    """Replay-time policies by region selector (name, base address, or ``*``).

    ``fallback``: policies for the regions none of these selects (the bounds a tuner derived on its
    baseline, under a user's explicit flags); they too win over the recorded annotations."""

    by_name: Mapping[str, VerifyPolicy]
    by_base: Mapping[int, VerifyPolicy]
    default: VerifyPolicy | None = None
    fallback: "ToleranceOverrides | None" = None

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
        return cls.from_mapping(policy_mapping(flags, files))

    def over(self, fallback: "ToleranceOverrides") -> "ToleranceOverrides":
        """These policies, and ``fallback``'s for the regions none of them selects."""
        if not fallback.selects_any:
            return self
        below = fallback if self.fallback is None else self.fallback.over(fallback)
        return ToleranceOverrides(self.by_name, self.by_base, self.default, below)

    @property
    def selects_any(self) -> bool:
        return bool(self.by_name or self.by_base or self.default is not None
                    or (self.fallback is not None and self.fallback.selects_any))

    def policy_for(self, name: str, base: int, recorded: VerifyPolicy | None) -> VerifyPolicy:
        """The policy of a region: by name, then by base, then ``*``, then the recorded one, else bitwise."""
        return self.resolve(name, base, recorded)[0]

    def resolve(
        self, name: str, base: int, recorded: VerifyPolicy | None, derived: VerifyPolicy | None = None
    ) -> tuple[VerifyPolicy, str]:
        """(policy, where it came from): a flag or file (by name, base, ``*``) wins, then the recording's
        annotation, then the policy ``--tolerance auto`` derived, else bitwise."""
        selected = self._selected(name, base)
        if selected is not None:
            return selected, SOURCE_FLAG
        if recorded is not None:
            return recorded, SOURCE_RECORDED
        if derived is not None:
            return derived, SOURCE_AUTO
        return VerifyPolicy(), SOURCE_DEFAULT

    def _selected(self, name: str, base: int) -> VerifyPolicy | None:
        """The policy a selector here (else in the fallback) gives the region: by name, base, then ``*``."""
        if name and name in self.by_name:
            return self.by_name[name]
        if base in self.by_base:
            return self.by_base[base]
        if self.default is not None:
            return self.default
        return self.fallback._selected(name, base) if self.fallback is not None else None

    def unused_selectors(self, regions: Iterable[tuple[str, int]]) -> list[str]:
        """Selectors that match no region (most likely a typo the user wants to hear about)."""
        regions = list(regions)
        names = {name for name, _ in regions}
        bases = {base for _, base in regions}
        unused = [n for n in self.by_name if n not in names]
        unused += [hex(b) for b in self.by_base if b not in bases]
        if self.fallback is not None:
            unused += [u for u in self.fallback.unused_selectors(regions) if u not in unused]
        return unused

    def to_dict(self) -> dict[str, Any]:
        """These selectors' policies (not the fallback's)."""
        out: dict[str, Any] = {n: p.to_dict() for n, p in self.by_name.items()}
        out.update({hex(b): p.to_dict() for b, p in self.by_base.items()})
        if self.default is not None:
            out["*"] = self.default.to_dict()
        return out


def policy_mapping(flags: Iterable[str] = (), files: Iterable[str | Path] = ()) -> dict[str, Any]:
    """``{selector: policy}`` from JSON files (in order) then ``SEL=spec`` flags, later entries winning;
    validated. The policies stay as given (spec strings or dicts): JSON-able, for settings files."""
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
        ToleranceOverrides.from_mapping(data, f"tolerance file {path}")  # validate with the file named
        merged.update(data)
    for flag in flags:
        selector, sep, spec = flag.partition("=")
        if not sep or not selector.strip():
            raise ConfigurationError(
                f"--tolerance {flag!r}: expected exact, auto or NAME_OR_BASE=dtype:mode:threshold[:norm], "
                "e.g. c=f32:relative:1e-6 or '*=f64:absolute:1e-9:linf'"
            )
        merged[selector.strip()] = spec.strip()
    ToleranceOverrides.from_mapping(merged)
    return merged


def tolerance_flags(values: Iterable[str], files: Iterable[str | Path] = ()) -> tuple[str | None, dict[str, Any]]:
    """What ``--tolerance`` (repeatable) and ``--tolerance-file`` ask for, in ``mneme replay`` and ``mneme
    tune`` alike: (the last mode given, ``exact`` or ``auto``, None when none was; the per-region
    policies, see :func:`policy_mapping`)."""
    values = [str(v) for v in values]
    modes = [v.strip() for v in values if v.strip() in TOLERANCE_MODES]
    policies = policy_mapping([v for v in values if v.strip() not in TOLERANCE_MODES], files)
    return (modes[-1] if modes else None), policies


def verification_from_flags(tolerance: Iterable[str] = (), tolerance_file: Iterable[str | Path] = (),
                            tolerance_runs: int = DEFAULT_RUNS, no_relocate: bool = False, *,
                            default_mode: str = "exact", policies: Mapping[str, Any] | None = None,
                            every_iteration: bool = False) -> VerificationSettings:
    """The verification settings of ``mneme replay``'s and ``mneme tune``'s shared flags.

    Args:
        tolerance: ``--tolerance`` values (repeatable): ``exact``/``auto`` (the last one wins) and
            ``SEL=dtype:mode:threshold[:norm]`` policies.
        tolerance_file: ``--tolerance-file`` JSON files of policies (the flags' policies win).
        tolerance_runs: ``--tolerance-runs``.
        no_relocate: ``--no-relocate`` (the recorded heap addresses or a refusal).
        default_mode: the mode when ``tolerance`` names none (``mneme tune``'s is ``auto``).
        policies: policies given before these flags (a settings file's); the flags' win per selector.
        every_iteration: ``--verify-every-launch``.

    Returns:
        The settings.

    Raises:
        ConfigurationError: a value that is neither a mode nor a policy, an unreadable file, too few runs.
    """
    mode, given = tolerance_flags(tolerance, tolerance_file)
    return VerificationSettings(mode=mode or default_mode, runs=tolerance_runs, overrides={**(policies or {}), **given},
                                relocate=False if no_relocate else None, every_iteration=every_iteration)


def judged_overrides(settings: VerificationSettings) -> ToleranceOverrides:
    """The policies a replay judges with besides the recorded annotations: the explicit overrides, then
    the derived policies for the regions they do not select.

    Args:
        settings: the verification settings.

    Returns:
        The overrides (checked: every policy parses).
    """
    explicit = ToleranceOverrides.from_mapping(settings.overrides, "tolerance overrides")
    return explicit.over(ToleranceOverrides.from_mapping(settings.derived, "derived tolerance"))


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
            f"mode one of {', '.join(POLICY_MODES)}; norm one of {', '.join(NORMS)}) or 'bitwise'"
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


def engine_check(actual: int, expected: int, size: int, policy: VerifyPolicy, hash_elem: int = 0) -> tuple:
    """The engine's check tuple (actual, expected, size, dtype code, mode code, threshold, hash_elem).

    ``hash_elem`` (1, 2, 4, 8) asks for the multiset and positional hashes of both sides
    too; a ``multiset`` policy always does (its verdict is theirs)."""
    if policy.mode == "multiset":
        hash_elem = policy.element_size
    elif policy.is_bitwise:
        return (actual, expected, size, BYTEWISE_CODE, 0, 0.0, hash_elem)
    if size % policy.element_size:
        raise ConfigurationError(
            f"a {size}-byte region cannot be compared as {policy.dtype} ({policy.element_size}-byte elements)"
        )
    if policy.mode == "multiset":  # the bytes say whether anything moved; the hashes judge
        return (actual, expected, size, BYTEWISE_CODE, 0, 0.0, hash_elem)
    # With a norm, the elementwise counters are informational; the threshold applies to the norm.
    code = DTYPE_CODES[policy.dtype]
    return (actual, expected, size, code, MODE_CODES[policy.mode], float(policy.threshold), hash_elem)


@dataclass(frozen=True)
class Verdict:
    passed: bool
    report: dict[str, Any]


def judge(policy: VerifyPolicy, stats: tuple[float, ...], counters: tuple[int, ...], size: int) -> Verdict:
    """Pass or fail one region from the engine's statistics, with the numbers a report needs."""
    counters = _full(counters)
    if policy.is_bitwise:
        differing = int(counters[0])
        report: dict[str, Any] = {"policy": "bitwise", "mismatched_bytes": differing}
        if differing:
            report["first_mismatch_offset"] = int(counters[1])
        return Verdict(differing == 0, report)
    if policy.mode == "multiset":
        same = tuple(counters[ACTUAL_MULTISET]) == tuple(counters[EXPECTED_MULTISET])
        report = {"policy": policy.to_dict(), "elements": size // policy.element_size,
                  "mismatched_bytes": int(counters[0]), "same_multiset": same}
        if counters[0]:
            report["first_mismatch_offset"] = int(counters[1])
        return Verdict(same, report)
    elements = size // policy.element_size
    violations, first, nan_mismatch = int(counters[VIOLATIONS]), int(counters[FIRST_VIOLATION]), int(counters[NAN_MISMATCH])
    report = {
        "policy": policy.to_dict(),
        "elements": elements,
        "differing_elements": int(counters[DIFFERING]),
        "max_abs_diff": stats[MAX_ABS_DIFF],
        "max_rel_diff": stats[MAX_REL_DIFF],
        "max_ulp": int(counters[MAX_ULP]),
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


def deviation(policy: VerifyPolicy, stats: tuple[float, ...], counters: tuple[int, ...]) -> dict[str, Any]:
    """How far one checked launch of a region was from the recording (``verified_within``'s ``worst``)."""
    counters = _full(counters)
    if policy.is_bitwise or policy.mode == "multiset":
        out: dict[str, Any] = {"differing_bytes": int(counters[0])}
        if policy.mode == "multiset":
            out["same_multiset"] = tuple(counters[ACTUAL_MULTISET]) == tuple(counters[EXPECTED_MULTISET])
        return out
    return {
        "differing_elements": int(counters[DIFFERING]),
        "max_ulp": int(counters[MAX_ULP]),
        "max_abs_diff": float(stats[MAX_ABS_DIFF]),
        "max_rel_diff": float(stats[MAX_REL_DIFF]),
    }


def _full(counters: tuple[int, ...]) -> tuple[int, ...]:
    """The engine's counters, padded to every slot (hashes are zero when none were asked for)."""
    return tuple(counters) + (0,) * (COUNTER_WORDS - len(counters))


def worse(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    """The larger of two deviations, key by key (same_multiset: False wins)."""
    if a is None:
        return dict(b)
    out = dict(a)
    for key, value in b.items():
        if key == "same_multiset":
            out[key] = bool(out.get(key, True) and value)
        else:
            out[key] = max(out.get(key, 0), value)
    return out


def is_exact(deviation_: dict[str, Any]) -> bool:
    """Whether a ``deviation`` found the region bit-equal to the recording."""
    return not deviation_.get("differing_bytes") and not deviation_.get("differing_elements")


def norms(norm: str, stats: tuple[float, ...]) -> tuple[float, float]:
    """(norm of the difference, norm of the recorded values) from the device statistics."""
    if norm == "l1":
        return stats[SUM_ABS_DIFF], stats[SUM_ABS_REF]
    if norm == "l2":
        return math.sqrt(stats[SUM_SQ_DIFF]), math.sqrt(stats[SUM_SQ_REF])
    if norm == "linf":
        return stats[MAX_ABS_DIFF], stats[MAX_ABS_REF]
    raise ConfigurationError(f"norm {norm!r} is not one of l1, l2, linf")
