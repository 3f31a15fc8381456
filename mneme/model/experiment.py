"""The experiment model: what a replay executes and what it reports.

``ExperimentConfiguration`` is one point of the replay configuration space
(launch shape, specialization, launch bounds, compile pipeline); its dict form
is the reference's ``Replay-config`` dict, key for key. ``ExperimentResult`` is
what one replay reports, with the reference's ``Result`` keys first.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import (
    Mapping,  # (typing.Mapping's isinstance is slow: _plain runs per result)
)
from dataclasses import dataclass, field
from typing import Any

from mneme.errors import ConfigurationError
from mneme.model.json_text import canonical_configuration_json, configuration_json

# CUDA launch limits (all compute capabilities mneme supports, 7.0 and newer).
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIM = (1024, 1024, 64)
MAX_GRID_DIM = (2**31 - 1, 65535, 65535)
# Driver JIT optimization levels (CU_JIT_OPTIMIZATION_LEVEL accepts 0..4).
CODEGEN_OPT_LEVELS = range(0, 5)
CODEGEN_METHODS = ("serial", "parallel")
DEFAULT_PASSES = "default<O3>"


@dataclass(frozen=True)
class Dim3:
    """A CUDA ``dim3``: grid or block extents.

    Attributes:
        x: extent along x (at least 1 to launch).
        y: extent along y.
        z: extent along z.
    """

    x: int = 1
    y: int = 1
    z: int = 1

    @property
    def count(self) -> int:
        """Threads (or blocks) in all: ``x * y * z``."""
        return self.x * self.y * self.z

    def as_tuple(self) -> tuple[int, int, int]:
        """The extents as ``(x, y, z)``.

        Returns:
            The tuple.
        """
        return (self.x, self.y, self.z)

    def to_dict(self) -> dict[str, int]:
        """The dict form ``{"x": .., "y": .., "z": ..}`` (what configurations and the wire use).

        Returns:
            The dict.
        """
        return {"x": self.x, "y": self.y, "z": self.z}

    @classmethod
    def from_value(cls, value: Any) -> "Dim3":
        """Accept a Dim3, a ``{"x":..,"y":..,"z":..}`` dict (missing axes are 1), or a sequence.

        Args:
            value: a Dim3, a dict of axes, or a sequence of one to three integers (missing axes are 1).

        Returns:
            The Dim3.

        Raises:
            ConfigurationError: an unknown axis, or a value that is not an integer.
        """
        if isinstance(value, Dim3):
            return value
        if type(value) is dict or isinstance(value, Mapping):  # (the ABC check only for other mappings)
            if not value.keys() <= _AXES:
                unknown = set(value) - _AXES
                raise ConfigurationError(f"dim3 has unknown axes {sorted(unknown)}; use x, y and z")
            x, y, z = value.get("x", 1), value.get("y", 1), value.get("z", 1)
            if type(x) is int and type(y) is int and type(z) is int:  # the common case: no conversion
                return cls(x, y, z)
            return cls(_as_int(x, "dim3.x"), _as_int(y, "dim3.y"), _as_int(z, "dim3.z"))
        if isinstance(value, (list, tuple)) and 1 <= len(value) <= 3:
            padded = list(value) + [1] * (3 - len(value))
            return cls(*(_as_int(v, "dim3") for v in padded))
        raise ConfigurationError(f"cannot read a dim3 from {value!r}; give {{'x':..,'y':..,'z':..}}")


_AXES = frozenset("xyz")


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise ConfigurationError(f"{what} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            pass
    raise ConfigurationError(f"{what} must be an integer, got {value!r}")


def _as_bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        return value.lower() in ("true", "1", "yes", "on")
    raise ConfigurationError(f"{what} must be true or false, got {value!r}")


@dataclass(frozen=True)
class ExperimentConfiguration:
    """One replay configuration. Field order and defaults are the reference's.

    Attributes:
        grid: blocks of the launch (``gridDim``).
        block: threads per block (``blockDim``).
        shared_mem: dynamic shared memory in bytes.
        specialize: compile with the kernel's scalar arguments fixed to their recorded values.
        set_launch_bounds: compile with ``__launch_bounds__(max_threads, min_blocks_per_sm)``.
        max_threads: the launch bounds' maximum threads per block (None: not set).
        min_blocks_per_sm: the launch bounds' minimum resident blocks per SM (None: not set).
        specialize_dims: compile with the launch's grid and block extents fixed.
        passes: the LLVM pass pipeline (the LLVM tier; ``DEFAULT_PASSES`` is the recorded code's).
        codegen_opt: the code generation level (PTX JIT ``-O0``..``-O4``; LLVM's ``llc`` level).
        codegen_method: how the LLVM tier generates code (the reference's ``serial``).
        prune: the LLVM tier removes code the kernel does not reach.
        internalize: the LLVM tier makes every function but the kernel internal.
    """

    grid: Dim3 = field(default_factory=Dim3)
    block: Dim3 = field(default_factory=Dim3)
    shared_mem: int = 0
    specialize: bool = False
    set_launch_bounds: bool = False
    max_threads: int | None = 1024
    min_blocks_per_sm: int | None = 1
    specialize_dims: bool = False
    passes: str = DEFAULT_PASSES
    codegen_opt: int = 3
    codegen_method: str = "serial"
    prune: bool = True
    internalize: bool = True

    # -- construction -----------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ExperimentConfiguration":
        """Build from a (possibly partial) dict; missing keys take the defaults.

        Args:
            data: the ``Replay-config`` dict, possibly partial: missing keys take the defaults.

        Returns:
            The configuration.

        Raises:
            ConfigurationError: unknown keys, or values of the wrong type.
        """
        if type(data) is not dict and not isinstance(data, Mapping):
            raise ConfigurationError(f"a configuration is a dict, got {type(data).__name__}")
        if not data.keys() <= _CONFIG_KEYS:
            unknown = set(data) - _CONFIG_KEYS
            raise ConfigurationError(
                f"unknown configuration keys {sorted(unknown)}; valid keys are {sorted(_CONFIG_KEYS)}"
            )
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in ("grid", "block"):
                kwargs[key] = Dim3.from_value(value)
            elif key in ("shared_mem", "codegen_opt"):
                kwargs[key] = _as_int(value, key)
            elif key in ("max_threads", "min_blocks_per_sm"):
                kwargs[key] = None if value is None else _as_int(value, key)
            elif key in ("specialize", "set_launch_bounds", "specialize_dims", "prune", "internalize"):
                kwargs[key] = _as_bool(value, key)
            elif key in ("passes", "codegen_method"):
                if not isinstance(value, str):
                    raise ConfigurationError(f"{key} must be a string, got {value!r}")
                kwargs[key] = value
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The reference's ``Replay-config`` dict; ``from_dict(to_dict())`` is the identity.

        Returns:
            A new dict of every field, ``grid`` and ``block`` as dicts.
        """
        out = {name: getattr(self, name) for name in _CONFIG_FIELDS}
        out["grid"], out["block"] = self.grid.to_dict(), self.block.to_dict()
        return out

    def replace(self, **changes: Any) -> "ExperimentConfiguration":
        """This configuration with some fields changed, checked as ``from_dict`` checks them.

        Args:
            **changes: field names and their new values (a ``Dim3`` or a dict for ``grid`` and ``block``).

        Returns:
            A new configuration.
        """
        merged = self.to_dict()
        merged.update({k: (v.to_dict() if isinstance(v, Dim3) else v) for k, v in changes.items()})
        return ExperimentConfiguration.from_dict(merged)

    # -- validation ---------------------------------------------------------
    @property
    def threads_per_block(self) -> int:
        """The block's threads (``block.count``)."""
        return self.block.count

    def validation_errors(self) -> list[str]:
        """Every reason this configuration cannot be launched; empty when valid.

        Returns:
            The reasons, one sentence each.
        """
        errors: list[str] = []
        for name, dim, limits in (("block", self.block, MAX_BLOCK_DIM), ("grid", self.grid, MAX_GRID_DIM)):
            for axis, value, limit in zip("xyz", dim.as_tuple(), limits):
                if value < 1:
                    errors.append(f"{name}.{axis}={value} must be at least 1")
                elif value > limit:
                    errors.append(f"{name}.{axis}={value} exceeds the CUDA limit {limit}")
        if self.threads_per_block > MAX_THREADS_PER_BLOCK:
            errors.append(
                f"{self.threads_per_block} threads per block exceed the CUDA limit {MAX_THREADS_PER_BLOCK}"
            )
        if self.shared_mem < 0:
            errors.append(f"shared_mem={self.shared_mem} must not be negative")
        if self.codegen_opt not in CODEGEN_OPT_LEVELS:
            errors.append(f"codegen_opt={self.codegen_opt} must be in 0..4")
        if self.codegen_method not in CODEGEN_METHODS:
            errors.append(f"codegen_method={self.codegen_method!r} must be one of {CODEGEN_METHODS}")
        if not self.passes.strip():
            errors.append("passes must name a pipeline, e.g. 'default<O3>'")
        if self.set_launch_bounds:
            if self.max_threads is None:
                errors.append("set_launch_bounds needs max_threads")
            else:
                if self.max_threads < self.threads_per_block:
                    errors.append(
                        f"max_threads={self.max_threads} is below the {self.threads_per_block} threads per block"
                    )
                if self.max_threads > MAX_THREADS_PER_BLOCK:
                    errors.append(f"max_threads={self.max_threads} exceeds {MAX_THREADS_PER_BLOCK}")
            if self.min_blocks_per_sm is not None and self.min_blocks_per_sm < 0:
                errors.append(f"min_blocks_per_sm={self.min_blocks_per_sm} must not be negative")
        return errors

    def is_valid(self) -> bool:
        """Whether it can be launched (``validation_errors()`` is empty).

        Returns:
            True when valid.
        """
        return not self.validation_errors()

    def ground(self) -> "ExperimentConfiguration":
        """The concrete configuration a replay executes.

        Knobs that have no effect are set to their defaults (launch-bound values
        without ``set_launch_bounds``), and unset launch bounds become concrete
        (``max_threads`` = 1024, ``min_blocks_per_sm`` = 1), so that two
        configurations that run the same experiment have the same ``hash``.

        Returns:
            The grounded configuration (this one when nothing changes).
        """
        if self.set_launch_bounds:
            max_threads = self.max_threads if self.max_threads is not None else MAX_THREADS_PER_BLOCK
            min_blocks = self.min_blocks_per_sm if self.min_blocks_per_sm is not None else 1
        else:
            max_threads, min_blocks = MAX_THREADS_PER_BLOCK, 1
        if (self.max_threads, self.min_blocks_per_sm) == (max_threads, min_blocks):
            return self
        return dataclasses.replace(self, max_threads=max_threads, min_blocks_per_sm=min_blocks)

    def code_knobs(self) -> dict[str, Any]:
        """The knobs that decide the code a replay runs (two configurations with equal ``code_knobs``
        run the same compile): all but the shared memory size, and the launch extents only when they
        are specialized into the code (``specialize_dims``).

        Returns:
            A new dict of those knobs.
        """
        knobs = self.ground().to_dict()
        knobs.pop("shared_mem")
        if not self.specialize_dims:
            knobs.pop("grid")
            knobs.pop("block")
        return knobs

    def code_key(self) -> str:
        """``code_knobs`` as canonical JSON: configurations with equal keys run the same compiled code.

        Returns:
            The JSON text.
        """
        return json.dumps(self.code_knobs(), sort_keys=True, separators=(",", ":"))

    def runs_recorded_code(self) -> bool:
        """Whether it runs the recorded launch's code (the default ``code_knobs``), which a replay worker
        already holds once it has prepared the instance: no compile process is needed for it.

        Returns:
            True for the recorded code.
        """
        return self.code_identity() == _RECORDED_CODE_IDENTITY

    def code_identity(self) -> tuple:
        """``code_knobs`` as a tuple: equal exactly when ``code_key`` is, at a tenth of its cost (the replay
        client keys its per-server compile bookkeeping by it, once per configuration it sends).

        Returns:
            The tuple of the knobs' values.
        """
        ground = self.ground()
        dims = (ground.grid.as_tuple(), ground.block.as_tuple()) if self.specialize_dims else ()
        return (ground.specialize, ground.set_launch_bounds, ground.max_threads, ground.min_blocks_per_sm,
                ground.specialize_dims, ground.passes, ground.codegen_opt, ground.codegen_method, ground.prune,
                ground.internalize, dims)

    def hash(self) -> str:
        """A stable identity: 16 hex digits of SHA-256 over the canonical JSON of ``to_dict``.

        The same across processes, machines and Python versions (no ``hash()``
        randomization, sorted keys, fixed separators).

        Returns:
            16 lowercase hex digits.
        """
        # Made once per (immutable) configuration, kept in the instance's __dict__ (a frozen dataclass's
        # setattr refuses; functools.cached_property's lock costs more than the text): the tuner and the
        # replay client ask for it several times per trial.
        cached = self.__dict__.get("_hash")
        if cached is None:
            canonical = canonical_configuration_json(self)
            cached = self.__dict__["_hash"] = (
                configuration_hash(self.to_dict()) if canonical is None  # a field of an unexpected type
                else hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16])
        return cached

    def to_json(self) -> str:
        """``json.dumps(self.to_dict())``, made once (as ``hash``): the results files write it per replay.

        Returns:
            The JSON text.
        """
        cached = self.__dict__.get("_json")
        if cached is None:
            cached = self.__dict__["_json"] = configuration_json(self) or json.dumps(self.to_dict())
        return cached

    def __str__(self) -> str:
        return json.dumps(self.to_dict())


_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(ExperimentConfiguration))
_RECORDED_CODE_IDENTITY = ExperimentConfiguration().code_identity()
_CONFIG_KEYS = frozenset(_CONFIG_FIELDS)


def configuration_hash(config: Mapping[str, Any]) -> str:
    """``ExperimentConfiguration.hash`` of a configuration already in its ``to_dict`` form.

    Args:
        config: a configuration's ``to_dict()`` form.

    Returns:
        16 lowercase hex digits.
    """
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


# Outcome categories of a replay, used by the tuner's trial records and the servers' metrics.
STATUS_VERIFIED = "verified"
STATUS_FAILED_VERIFICATION = "failed_verification"
STATUS_INVALID_CONFIG = "invalid_config"
STATUS_INVALID_LAUNCH = "invalid_launch"
STATUS_COMPILE_ERROR = "compile_error"
STATUS_RUNTIME_ERROR = "runtime_error"
STATUS_TIMEOUT = "timeout"
STATUS_INTERNAL_ERROR = "internal_error"
STATUSES = (
    STATUS_VERIFIED,
    STATUS_FAILED_VERIFICATION,
    STATUS_INVALID_CONFIG,
    STATUS_INVALID_LAUNCH,
    STATUS_COMPILE_ERROR,
    STATUS_RUNTIME_ERROR,
    STATUS_TIMEOUT,
    STATUS_INTERNAL_ERROR,
)


@dataclass
class ExperimentResult:
    """What one replay reports.

    ``exec_time`` holds every launch in nanoseconds, warm-ups first (``warmup``
    of them), as the reference reports it. Times are seconds for the
    ``*_time`` floats; sizes are bytes; ``-1`` means "not measured".

    Attributes:
        preprocess_ir_time, opt_time, codegen_time: seconds in the LLVM tier's preprocessing and passes,
            and in code generation (the PTX compiler and the module load).
        obj_size: the loaded code's size in bytes.
        exec_time: every launch in nanoseconds, the ``warmup`` launches first.
        verified: the replay matched the recorded epilogue (bitwise, or within the policies of ``verified_within``).
        executed: the kernel ran.
        failed: the replay did not complete (``status`` and ``error`` say why).
        start_time, end_time: ISO 8601 timestamps of the replay.
        gpu_id: the GPU that ran it.
        const_mem_usage, local_mem_usage, reg_usage, shared_mem_usage: the compiled kernel's resources
            (bytes; registers per thread).
        error: the failure's message.
        status: the outcome (``mneme.model.experiment`` statuses: ``verified``, ``invalid_config``, ``timeout``, ...).
        warmup: how many of ``exec_time``'s launches were warm-ups.
        compile_cached: the code came from the compile cache.
        mismatches: per region that differed, where and by how much.
        relocated: heap buffers were placed elsewhere than recorded and the pointers to them rewritten.
        relocation_reason: why, when ``relocated``.
        verified_within: per region judged with a tolerance: the bound, its source and the worst deviation.
        nondeterminism: per region where the recorded launch itself did not repeat bit-exactly, what its runs showed.
        reset_each_launch: the written memory was reset before every launch, not only the first.
        reset_reason: why, when ``reset_each_launch``.
        energy_j: joules per launch from NVML's energy counter (-1: not measured).
        power_w: mean power over the energy window in watts (-1: not measured).
        conditions: the GPU's clocks, temperature, power and throttling around the measured launches.
        metrics: hardware counters of one launch, name -> value.
        metrics_error: why the counters asked for could not be collected.
    """

    preprocess_ir_time: float = 0.0
    opt_time: float = 0.0
    codegen_time: float = 0.0
    obj_size: int = -1
    exec_time: list[int] = field(default_factory=list)
    verified: bool = False
    executed: bool = False
    failed: bool = False
    start_time: str = ""
    end_time: str = ""
    gpu_id: int = -1
    const_mem_usage: int = -1
    local_mem_usage: int = -1
    reg_usage: int = -1
    error: str = ""
    # mneme's additions (after the reference's keys)
    status: str = ""
    warmup: int = 0
    shared_mem_usage: int = -1
    compile_cached: bool = False
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    #: Heap buffers were placed elsewhere than at their recorded addresses (and the pointers to
    #: them rewritten), because the recorded addresses could not be had in the replay process or
    #: the recording is relocatable. Module globals always live where the loaded module puts them
    #: and do not count.
    relocated: bool = False
    #: Why, when ``relocated``: the driver's error for the recorded range and what held it in the
    #: replay process's /proc/self/maps, another replay's lease, or a relocatable recording.
    relocation_reason: str = ""
    #: Regions judged with a tolerance (``--tolerance``, a recorded annotation, or ``auto``): per
    #: region label the bound used (``policy``), where it came from (``source``; ``derived``
    #: provenance for ``auto``), and this replay's worst deviation over its checked launches
    #: (``worst``; ``exact`` when the region matched bit for bit). Empty unless verified.
    verified_within: dict[str, Any] = field(default_factory=dict)
    #: When the recorded launch itself was replayed and did not verify bit-exactly: per region that
    #: differed, what its repeated runs showed (``mneme.replay.nondeterminism.RegionFinding``).
    nondeterminism: list[dict[str, Any]] = field(default_factory=list)
    #: The written memory was reset before every launch, not only before a configuration's first:
    #: the kernel is not idempotent (its second launch without a reset did not reproduce the
    #: recording, faulted or did not finish), or the reset policy was ``always``.
    reset_each_launch: bool = False
    #: Why, when ``reset_each_launch``.
    reset_reason: str = ""
    #: Joules per launch, from NVML's energy counter over an energy window of the configuration's launches
    #: run back to back (``MeasurementSettings.energy``); -1: not measured (``conditions["energy"]`` says why).
    energy_j: float = -1.0
    #: Mean power over that window, watts; -1: not measured.
    power_w: float = -1.0
    #: The GPU around the measured launches (NVML): ``before`` and ``after`` readings (``sm_clock_mhz``,
    #: ``mem_clock_mhz``, ``temperature_c``, ``power_w``, ``clock_event_reasons``; ``before.age_s``), whether
    #: it ``throttled`` and the ``throttle_reasons``; ``energy``: the energy window (or why it measured
    #: nothing); ``unavailable``: why NVML could not say. Empty when nothing was read.
    conditions: dict[str, Any] = field(default_factory=dict)
    #: Hardware counters of one launch of the configuration, profiled after the timed launches (asked for
    #: by name: ``mneme replay --metrics``, ``Replayer.run(metrics=...)``; ``mneme.replay.metrics``): name
    #: -> value. Empty when none were asked for or they could not be collected (``metrics_error``).
    metrics: dict[str, float] = field(default_factory=dict)
    #: Why the counters asked for could not be collected ('' when they were, or none were asked for).
    metrics_error: str = ""

    @property
    def exact(self) -> bool:
        """Verified, and every region bit-equal to the recording (no tolerance was needed)."""
        return self.verified and all(entry.get("exact", False) for entry in self.verified_within.values())

    @property
    def throttled(self) -> bool:
        """Measured while the GPU throttled (power or thermal limits slowed its clocks): ``conditions`` says."""
        return bool(self.conditions.get("throttled"))

    @property
    def measured_times(self) -> list[int]:
        """The launches after the warm-ups."""
        return self.exec_time[self.warmup :]

    def to_dict(self) -> dict[str, Any]:
        """The result as plain JSON types, the fields in order.

        Returns:
            A new dict.
        """
        out = self.__dict__.copy()  # the fields in their order, as __init__ set them (3x cheaper than getattr each)
        if tuple(out) != _RESULT_FIELDS:  # attributes beyond the fields, or set in another order
            return {name: _plain(getattr(self, name)) for name in _RESULT_FIELDS}
        for name, value in out.items():
            if type(value) not in _SCALARS:
                out[name] = _plain(value)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ExperimentResult":
        """The result a ``to_dict`` (or a results file's line) describes.

        Args:
            data: the dict; missing keys take the defaults.

        Returns:
            The result.

        Raises:
            ConfigurationError: unknown keys.
        """
        unknown = set(data) - _RESULT_KEYS
        if unknown:
            raise ConfigurationError(f"unknown result keys {sorted(unknown)}")
        kwargs = dict(data)
        if "exec_time" in kwargs:
            kwargs["exec_time"] = [int(t) for t in kwargs["exec_time"]]
        if "mismatches" in kwargs:
            kwargs["mismatches"] = [dict(m) for m in kwargs["mismatches"]]
        if "nondeterminism" in kwargs:
            kwargs["nondeterminism"] = [dict(m) for m in kwargs["nondeterminism"]]
        if "metrics" in kwargs:
            kwargs["metrics"] = {str(k): float(v) for k, v in dict(kwargs["metrics"]).items()}
        if "verified_within" in kwargs:
            kwargs["verified_within"] = {str(k): dict(v) for k, v in dict(kwargs["verified_within"]).items()}
        if "conditions" in kwargs:
            kwargs["conditions"] = dict(kwargs["conditions"] or {})
        return cls(**kwargs)

    @classmethod
    def failure(cls, status: str, error: str, **fields: Any) -> "ExperimentResult":
        """A result for a replay that did not complete (the tuner penalises it).

        Args:
            status: the outcome (``runtime_error``, ``timeout``, ``invalid_config``, ...).
            error: what happened, for the user.
            **fields: more fields of the result.

        Returns:
            A result with ``failed`` set.
        """
        return cls(failed=True, status=status, error=error, **fields)


_RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(ExperimentResult))
_RESULT_KEYS = frozenset(_RESULT_FIELDS)


_SCALARS = frozenset({int, float, str, bool, type(None)})


def _plain(value: Any) -> Any:
    if type(value) in _SCALARS:  # most fields: no ABC check (to_dict runs for every result a client takes)
        return value
    if isinstance(value, list):
        return [v if type(v) in _SCALARS else dict(v) if isinstance(v, Mapping) else v for v in value]
    if isinstance(value, Mapping):
        return {k: dict(v) if isinstance(v, Mapping) else v for k, v in value.items()}
    return value
