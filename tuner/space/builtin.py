"""The built-in search space of ``mneme tune`` and its presets.

Without ``--space-module`` the tuner derives its space from the recorded
launch: block shapes that keep the work covered (:mod:`tuner.space.launch_shapes`),
pass pipelines, codegen levels, and the specialization and launch-bound
switches. A preset fills in whatever the command line leaves open.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from mneme.errors import ConfigurationError
from mneme.model.experiment import MAX_THREADS_PER_BLOCK, Dim3, ExperimentConfiguration
from tuner.space.knobs import KnobApplicability
from tuner.space.launch_shapes import (
    RecordedLaunch,
    block_shapes,
    covering_grid,
    parse_shape_key,
    shape_key,
)
from tuner.space.search_space import (
    DEFAULT_PIPELINES,
    BoolParam,
    CategoricalParam,
    FixedParam,
    IntRangeParam,
    Param,
    PipelineParam,
    SearchSpace,
)

BOOL_MODES = ("fixed", "on", "off", "on-off")
MAX_THREADS_POLICIES = ("recorded", "block-threads", "powers-of-two", "hardware")
PRESETS = ("quick", "standard", "launch", "compiler", "full")


@dataclass
class BuiltinSpaceSettings:
    """Everything the built-in space depends on, fully resolved."""

    launch_dim: str = "auto"
    launch_safety: str = "balanced"
    passes: list[str] = field(default_factory=lambda: list(DEFAULT_PIPELINES))
    codegen_opt: list[int] = field(default_factory=lambda: [1, 2, 3])
    specialize: str = "fixed"
    specialize_dims: str = "fixed"
    launch_bounds: str = "fixed"
    max_threads_policy: str = "block-threads"
    max_threads_range: tuple[int, int] = (32, MAX_THREADS_PER_BLOCK)
    min_blocks_per_sm: list[int] = field(default_factory=lambda: [1])

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["max_threads_range"] = list(self.max_threads_range)
        return out


# What each preset sets; the command line overrides any of it.
PRESET_SETTINGS: dict[str, dict[str, Any]] = {
    "quick": {"launch_safety": "conservative", "passes": ["default<O3>", "default<O2>"], "codegen_opt": [2, 3]},
    "standard": {"launch_safety": "balanced", "passes": list(DEFAULT_PIPELINES), "codegen_opt": [1, 2, 3]},
    "launch": {"launch_safety": "balanced", "passes": ["default<O3>"], "codegen_opt": [3]},
    "compiler": {"launch_dim": "none", "passes": list(DEFAULT_PIPELINES), "codegen_opt": [1, 2, 3]},
    "full": {
        "launch_safety": "aggressive",
        "passes": list(DEFAULT_PIPELINES),
        "codegen_opt": [1, 2, 3],
        "specialize": "on-off",
        "specialize_dims": "on-off",
        "launch_bounds": "on-off",
        "min_blocks_per_sm": list(range(1, 9)),
    },
}


def preset_settings(preset: str, overrides: Mapping[str, Any]) -> BuiltinSpaceSettings:
    """The preset's settings with ``overrides`` (those not None) applied, validated."""
    if preset not in PRESET_SETTINGS:
        raise ConfigurationError(f"--space-preset {preset!r}: choose one of {', '.join(PRESETS)}")
    values = {**asdict(BuiltinSpaceSettings()), **PRESET_SETTINGS[preset]}
    values.update({k: v for k, v in overrides.items() if v is not None})
    settings = BuiltinSpaceSettings(**values)
    _validate(settings)
    return settings


def _validate(s: BuiltinSpaceSettings) -> None:
    for flag, mode in (("--specialize-space", s.specialize), ("--specialize-dims-space", s.specialize_dims),
                       ("--launch-bounds-space", s.launch_bounds)):
        if mode not in BOOL_MODES:
            raise ConfigurationError(f"{flag} {mode!r}: choose one of {', '.join(BOOL_MODES)}")
    if s.max_threads_policy not in MAX_THREADS_POLICIES:
        raise ConfigurationError(
            f"--max-threads-policy {s.max_threads_policy!r}: choose one of {', '.join(MAX_THREADS_POLICIES)}"
        )
    if not s.passes:
        raise ConfigurationError("no pass pipeline to tune: give --passes or --fixed-passes")
    if not s.codegen_opt or any(not 0 <= c <= 4 for c in s.codegen_opt):
        raise ConfigurationError(f"codegen levels {s.codegen_opt} must be within 0..4")
    lo, hi = s.max_threads_range
    if not 1 <= lo <= hi <= MAX_THREADS_PER_BLOCK:
        raise ConfigurationError(f"--max-threads-range {lo} {hi} must satisfy 1 <= LOW <= HIGH <= 1024")
    if not s.min_blocks_per_sm or any(m < 0 for m in s.min_blocks_per_sm):
        raise ConfigurationError(f"min blocks per SM {s.min_blocks_per_sm} must be non-negative")


def _bool_choices(mode: str) -> list[bool]:
    return {"fixed": [False], "off": [False], "on": [True], "on-off": [False, True]}[mode]


def _dimension(name: str, values: list[Any], kind: type[Param] = CategoricalParam) -> Param:
    """A dimension over ``values``: fixed when there is one, a range when they are consecutive ints."""
    if len(values) == 1:
        return FixedParam(name, values[0])
    if kind is IntRangeParam:
        low, high = min(values), max(values)
        if sorted(values) == list(range(low, high + 1)):
            return IntRangeParam(name, low, high)
        return CategoricalParam(name, sorted(values))
    return kind(name, values)


class BuiltinSearchSpace(SearchSpace):
    """Launch shape, pipeline, codegen level, specialization and launch bounds of one recorded kernel."""

    def __init__(self, recorded_kernel: Any, settings: BuiltinSpaceSettings | None = None,
                 knobs: KnobApplicability | None = None) -> None:
        self.settings = settings or BuiltinSpaceSettings()
        self.knobs = knobs
        _validate(self.settings)
        self.recorded = RecordedLaunch(
            Dim3.from_value(_dim3_dict(recorded_kernel.grid_dim)),
            Dim3.from_value(_dim3_dict(recorded_kernel.block_dim)),
            int(recorded_kernel.shared_mem),
        )
        s = self.settings
        self.shapes = block_shapes(self.recorded, s.launch_dim, s.launch_safety,
                                   knobs.max_block_threads if knobs is not None else None)
        dims: dict[str, Param] = {
            "block_shape": _dimension("block_shape", [shape_key(b) for b in self.shapes]),
            "passes": _dimension("passes", list(s.passes), PipelineParam),
            "codegen_opt": _dimension("codegen_opt", list(s.codegen_opt), IntRangeParam),
        }
        for name, mode in (("specialize", s.specialize), ("specialize_dims", s.specialize_dims),
                           ("set_launch_bounds", s.launch_bounds)):
            if mode == "on-off":
                dims[name] = BoolParam(name)
        if s.launch_bounds != "off" and s.launch_bounds != "fixed":
            if s.max_threads_policy == "powers-of-two":
                lo, hi = s.max_threads_range
                powers = [p for p in (2**i for i in range(11)) if lo <= p <= hi]
                if not powers:
                    raise ConfigurationError(f"--max-threads-range {lo} {hi} contains no power of two")
                dims["max_threads"] = _dimension("max_threads", powers)
            dims["min_blocks_per_sm"] = _dimension("min_blocks_per_sm", list(s.min_blocks_per_sm), IntRangeParam)
        self._dims = dims

    def dimensions(self) -> dict[str, Param]:
        return self._dims

    def _max_threads(self, params: Mapping[str, Any], block: Dim3) -> int:
        policy = self.settings.max_threads_policy
        if policy == "powers-of-two":
            return int(params["max_threads"])
        if policy == "recorded":
            return self.recorded.block.count
        if policy == "hardware":
            return MAX_THREADS_PER_BLOCK
        return block.count

    def _switch(self, params: Mapping[str, Any], name: str, mode: str) -> bool:
        return bool(params[name]) if name in params else _bool_choices(mode)[0]

    def constraints(self, params: Mapping[str, Any]) -> bool:
        """Launch bounds below the block's thread count cannot launch: skip them."""
        if not self._switch(params, "set_launch_bounds", self.settings.launch_bounds):
            return True
        block = parse_shape_key(params["block_shape"])
        return self._max_threads(params, block) >= block.count

    def derived(self, params: Mapping[str, Any]) -> ExperimentConfiguration:
        s = self.settings
        block = parse_shape_key(params["block_shape"])
        bounds = self._switch(params, "set_launch_bounds", s.launch_bounds)
        config = {
            "grid": covering_grid(self.recorded.total, block).to_dict(),
            "block": block.to_dict(),
            "shared_mem": self.recorded.shared_mem,
            "passes": params["passes"],
            "codegen_opt": int(params["codegen_opt"]),
            "specialize": self._switch(params, "specialize", s.specialize),
            "specialize_dims": self._switch(params, "specialize_dims", s.specialize_dims),
            "set_launch_bounds": bounds,
        }
        if bounds:
            config["max_threads"] = self._max_threads(params, block)
            config["min_blocks_per_sm"] = int(params.get("min_blocks_per_sm", s.min_blocks_per_sm[0]))
        return ExperimentConfiguration.from_dict(config)

    def baseline(self) -> ExperimentConfiguration:
        """The recorded launch at the highest codegen level of the space."""
        return ExperimentConfiguration.from_dict({
            "grid": self.recorded.grid.to_dict(),
            "block": self.recorded.block.to_dict(),
            "shared_mem": self.recorded.shared_mem,
            "codegen_opt": max(self.settings.codegen_opt),
        })

    def baseline_params(self) -> dict[str, Any]:
        """The point whose configuration is :meth:`baseline`'s (the recorded shape, no launch bounds)."""
        baseline = self.baseline()
        known = {"block_shape": shape_key(baseline.block), "passes": baseline.passes,
                 "codegen_opt": baseline.codegen_opt, "specialize": False, "specialize_dims": False,
                 "set_launch_bounds": False}
        return {name: known[name] if name in known else param.values()[0] for name, param in self._dims.items()}

    def describe_extra(self) -> dict[str, Any]:
        return {
            "builtin": {
                "settings": self.settings.to_dict(),
                "recorded": {"grid": self.recorded.grid.to_dict(), "block": self.recorded.block.to_dict(),
                             "shared_mem": self.recorded.shared_mem,
                             "total_threads": self.recorded.total.to_dict()},
                "block_shapes": len(self.shapes),
                **({"knobs": self.knobs.describe()} if self.knobs is not None else {}),
            }
        }


def _dim3_dict(value: Any) -> Any:
    """Accept a Dim3, a dict, a sequence, or any object with x/y/z attributes."""
    if hasattr(value, "x") and not isinstance(value, Mapping):
        return {"x": int(value.x), "y": int(getattr(value, "y", 1)), "z": int(getattr(value, "z", 1))}
    return value
