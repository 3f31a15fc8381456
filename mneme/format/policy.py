"""Per-buffer verification policy: how a replayed region is compared with the recorded epilogue.

Bitwise equality is the default (a replay must be bit-exact); a region whose
kernel is legitimately nondeterministic (atomics on floats, reductions in a
different order after a block-size change) can declare a typed tolerance.
The replay engine applies the policy; this module only defines and validates it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from mneme.errors import ArtifactError
from mneme.format.schema import JsonReader

#: Element types and their sizes in bytes.
DTYPES = {
    "u8": 1, "i8": 1, "u16": 2, "i16": 2, "u32": 4, "i32": 4, "u64": 8, "i64": 8,
    "f16": 2, "bf16": 2, "f32": 4, "f64": 8,
}  # fmt: skip
MODES = ("bitwise", "absolute", "relative", "ulp", "multiset")
#: Modes that apply element by element only (no norm).
ELEMENTWISE_MODES = ("ulp", "multiset")
NORMS = ("none", "l1", "l2", "linf")


@dataclass(frozen=True)
class VerifyPolicy:
    """How to compare one region.

    * ``bitwise``: bytes equal (``dtype``, ``threshold`` and ``norm`` unused).
    * ``absolute``: ``|replayed - recorded| <= threshold``.
    * ``relative``: ``|replayed - recorded| <= threshold * |recorded|``.
    * ``ulp``: the distance in units in the last place is at most ``threshold``
      (integers: ``|replayed - recorded| <= threshold``); elementwise only.
    * ``multiset``: the region holds the same multiset of ``dtype``-sized
      elements in any order (an atomic-index compaction); ``threshold`` unused.

    With ``norm="none"`` the test applies element by element; with ``l1``,
    ``l2`` or ``linf`` it applies to the norm of the difference vector (and of
    the recorded vector for ``relative``).
    """

    dtype: str = "u8"
    mode: str = "bitwise"
    threshold: float = 0.0
    norm: str = "none"

    def __post_init__(self) -> None:
        errors = self.validation_errors()
        if errors:
            raise ArtifactError("invalid verification policy: " + "; ".join(errors))

    def validation_errors(self) -> list[str]:
        errors = []
        if self.dtype not in DTYPES:
            errors.append(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.mode not in MODES:
            errors.append(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.norm not in NORMS:
            errors.append(f"norm {self.norm!r} is not one of {', '.join(NORMS)}")
        elif self.mode in ELEMENTWISE_MODES and self.norm != "none":
            errors.append(f"mode {self.mode} compares element by element: norm must be none, not {self.norm}")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)):
            errors.append(f"threshold {self.threshold!r} is not a number")
        elif not math.isfinite(self.threshold) or self.threshold < 0:
            errors.append(f"threshold {self.threshold} must be a finite number >= 0")
        return errors

    @property
    def is_bitwise(self) -> bool:
        return self.mode == "bitwise"

    @property
    def element_size(self) -> int:
        return DTYPES[self.dtype]

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "mode": self.mode, "threshold": float(self.threshold), "norm": self.norm}

    def spec(self) -> str:
        """The ``--tolerance`` spelling: ``bitwise``, ``f32:ulp:16``, ``f32:relative:1e-06:l2``."""
        if self.is_bitwise:
            return "bitwise"
        text = f"{self.dtype}:{self.mode}:{self.threshold:g}"
        return text if self.norm == "none" else f"{text}:{self.norm}"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], what: str = "verification policy") -> "VerifyPolicy":
        """Parse a policy; every problem is an ArtifactError naming ``what``."""
        r = JsonReader(what)
        d = r.obj(data, "", required=("mode",), optional=("dtype", "threshold", "norm"))
        mode = r.choice(d["mode"], "mode", MODES)
        dtype = r.choice(d.get("dtype", "u8"), "dtype", tuple(DTYPES))
        threshold = r.number(d.get("threshold", 0.0), "threshold")
        norm = r.choice(d.get("norm", "none"), "norm", NORMS)
        if threshold < 0:
            raise r.error("threshold", f"{threshold} must be >= 0")
        if mode in ELEMENTWISE_MODES and norm != "none":
            raise r.error("norm", f"mode {mode} compares element by element: norm must be none")
        return cls(dtype=dtype, mode=mode, threshold=threshold, norm=norm)


BITWISE = VerifyPolicy()
