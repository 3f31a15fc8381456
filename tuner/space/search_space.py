"""Search spaces: the user's tuning problem, separate from what a replay executes.

A :class:`SearchSpace` declares named parameters (``dimensions``), filters
samples (``constraints``), projects a sample onto a concrete
:class:`~mneme.model.experiment.ExperimentConfiguration` (``derived``) and names the
reference point (``baseline``). The parameter types know three things a
sampler needs: how to enumerate their values (exhaustive and grid search), how
to ask an Optuna trial for one (random, TPE, NSGA-II), and how to describe
themselves (``search_space.json``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

from mneme.errors import ConfigurationError, MnemeError
from mneme.model.experiment import ExperimentConfiguration

# The five pipelines the reference tunes by default, weakest to smallest code.
DEFAULT_PIPELINES = ("default<O1>", "default<O2>", "default<O3>", "default<Os>", "default<Oz>")


class Param:
    """One tunable dimension. Subclasses are small dataclasses."""

    name: str

    def values(self) -> list[Any]:
        """Every value, in order (for exhaustive and grid search).

        Returns:
            The values, a new list.
        """
        raise NotImplementedError

    @property
    def finite(self) -> bool:
        """Whether the values can be enumerated (every dimension but a real one without ``step``)."""
        return True

    def size(self) -> int | None:
        """How many values; None when the dimension is continuous.

        Returns:
            The number of values, or None.
        """
        return len(self.values()) if self.finite else None

    def distribution(self):
        """The Optuna distribution of this dimension.

        Returns:
            An ``optuna.distributions`` object.
        """
        raise NotImplementedError

    def suggest(self, trial) -> Any:
        """Ask an Optuna trial for a value of this dimension.

        Args:
            trial: the ``optuna.Trial`` to ask (the parameter is named ``name``).

        Returns:
            The value the trial suggests.
        """
        raise NotImplementedError

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is one of this dimension's values (resuming a run checks its recorded points).

        Args:
            value: a parameter value, as a trial record holds it.

        Returns:
            True when it belongs to the dimension.
        """
        return value in self.values()

    def describe(self) -> dict[str, Any]:
        """This dimension as JSON (``search_space.json``, ``--print-space``).

        Returns:
            A dict with ``type`` and the dimension's settings.
        """
        raise NotImplementedError


@dataclass
class IntRangeParam(Param):
    """Integers ``low, low+step, ..., <= high`` (both ends included, as in the reference).

    Attributes:
        name: the parameter's name.
        low, high: the first and last value (both included).
        step: the distance between values.
        log: sample on a log scale (TPE; ``low`` must be positive).
    """

    name: str
    low: int
    high: int
    step: int = 1
    log: bool = False

    def __post_init__(self) -> None:
        if self.step < 1:
            raise ConfigurationError(f"{self.name}: step must be at least 1, got {self.step}")
        if self.high < self.low:
            raise ConfigurationError(f"{self.name}: high={self.high} is below low={self.low}")
        if self.log and (self.low < 1 or self.step != 1):
            raise ConfigurationError(f"{self.name}: a log range needs low >= 1 and step 1")

    def values(self) -> list[int]:
        return list(range(self.low, self.high + 1, self.step))

    def distribution(self):
        import optuna

        high = self.low + (self.high - self.low) // self.step * self.step
        return optuna.distributions.IntDistribution(self.low, high, step=self.step, log=self.log)

    def suggest(self, trial) -> int:
        high = self.low + (self.high - self.low) // self.step * self.step
        return trial.suggest_int(self.name, self.low, high, step=self.step, log=self.log)

    def contains(self, value: Any) -> bool:
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            and self.low <= value <= self.high
            and (value - self.low) % self.step == 0
        )

    def describe(self) -> dict[str, Any]:
        return {"type": "int", "low": self.low, "high": self.high, "step": self.step, "log": self.log,
                "size": self.size()}


@dataclass
class CategoricalParam(Param):
    """A choice among listed values (JSON scalars: str, int, float, bool, None).

    Attributes:
        name: the parameter's name.
        choices: the values, in order.
    """

    name: str
    choices: Sequence[Any]

    def __post_init__(self) -> None:
        self.choices = list(self.choices)
        if not self.choices:
            raise ConfigurationError(f"{self.name}: a categorical parameter needs at least one choice")
        for choice in self.choices:
            if not (choice is None or isinstance(choice, (str, int, float, bool))):
                raise ConfigurationError(
                    f"{self.name}: choice {choice!r} is not a JSON scalar; encode it as a string"
                )
        if len({(type(c), c) for c in self.choices}) != len(self.choices):
            raise ConfigurationError(f"{self.name}: choices {self.choices} repeat a value")

    def values(self) -> list[Any]:
        return list(self.choices)

    def distribution(self):
        import optuna

        return optuna.distributions.CategoricalDistribution(self.choices)

    def suggest(self, trial) -> Any:
        return trial.suggest_categorical(self.name, self.choices)

    def describe(self) -> dict[str, Any]:
        return {"type": "categorical", "choices": list(self.choices), "size": self.size()}


@dataclass
class PipelineParam(CategoricalParam):
    """A choice among LLVM pass pipelines (``default<O3>`` or a comma-separated pass list).

    Attributes:
        name: the parameter's name.
        choices: the pipelines (the reference's five by default).
    """

    choices: Sequence[str] = DEFAULT_PIPELINES

    def __post_init__(self) -> None:
        super().__post_init__()
        for choice in self.choices:
            if not isinstance(choice, str) or not choice.strip():
                raise ConfigurationError(f"{self.name}: pipeline {choice!r} must be a non-empty string")

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "type": "pipeline"}


@dataclass
class BoolParam(CategoricalParam):
    """A boolean knob: both values, False first.

    Attributes:
        name: the parameter's name.
        choices: the values (both by default).
    """

    choices: Sequence[bool] = (False, True)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "type": "bool"}


@dataclass
class RealParam(Param):
    """A real interval ``[low, high]``; finite (enumerable) only with a ``step``.

    Attributes:
        name: the parameter's name.
        low, high: the interval's ends.
        step: the distance between values (None: continuous).
        log: sample on a log scale.
    """

    name: str
    low: float
    high: float
    step: float | None = None
    log: bool = False

    def __post_init__(self) -> None:
        if self.high < self.low:
            raise ConfigurationError(f"{self.name}: high={self.high} is below low={self.low}")
        if self.step is not None and self.step <= 0:
            raise ConfigurationError(f"{self.name}: step must be positive, got {self.step}")
        if self.log and (self.low <= 0 or self.step is not None):
            raise ConfigurationError(f"{self.name}: a log range needs low > 0 and no step")

    @property
    def finite(self) -> bool:
        """Whether the values can be enumerated: only with a ``step``."""
        return self.step is not None

    def values(self) -> list[float]:
        if self.step is None:
            raise ConfigurationError(
                f"{self.name}: a continuous RealParam cannot be enumerated; give it a step, "
                "or use --sampler random or tpe"
            )
        count = int(math.floor((self.high - self.low) / self.step + 1e-9)) + 1
        return [round(self.low + i * self.step, 12) for i in range(count)]

    def distribution(self):
        import optuna

        return optuna.distributions.FloatDistribution(self.low, self.high, step=self.step, log=self.log)

    def suggest(self, trial) -> float:
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)

    def contains(self, value: Any) -> bool:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False
        if not self.low - 1e-12 <= value <= self.high + 1e-12:
            return False
        return self.step is None or any(abs(value - v) < 1e-9 for v in self.values())

    def describe(self) -> dict[str, Any]:
        return {"type": "real", "low": self.low, "high": self.high, "step": self.step, "log": self.log,
                "size": self.size()}


@dataclass
class FixedParam(Param):
    """A dimension pinned to one value (kept in the parameters for the record).

    Attributes:
        name: the parameter's name.
        value: its only value.
    """

    name: str
    value: Any

    def values(self) -> list[Any]:
        return [self.value]

    def distribution(self):
        import optuna

        return optuna.distributions.CategoricalDistribution([self.value])

    def suggest(self, trial) -> Any:
        return trial.suggest_categorical(self.name, [self.value])

    def describe(self) -> dict[str, Any]:
        return {"type": "fixed", "value": self.value, "size": 1}


class SearchSpace:
    """The tuning problem. Subclass it and define ``dimensions``, ``derived`` and ``baseline``.

    ``dimensions()`` returns a mapping name -> parameter (a list of parameters
    is accepted too); ``constraints(params)`` says whether a sample is worth
    replaying (default: all are); ``derived(params)`` maps a sample to the
    configuration a replay executes; ``baseline()`` is the reference
    configuration speedups are measured against.
    """

    def dimensions(self) -> Mapping[str, Param] | Sequence[Param]:
        """The space's dimensions.

        Returns:
            A mapping name -> ``Param``, or a list of parameters (each named by its ``name``).
        """
        raise NotImplementedError(f"{type(self).__name__} must define dimensions()")

    def constraints(self, params: Mapping[str, Any]) -> bool:
        """Whether a sample is worth replaying (default: every one is).

        Args:
            params: the sample: parameter name -> value.

        Returns:
            False to skip it (it is recorded as skipped, not replayed).
        """
        return True

    def derived(self, params: Mapping[str, Any]) -> ExperimentConfiguration:
        """The configuration a sample stands for.

        Args:
            params: the sample: parameter name -> value.

        Returns:
            The ``ExperimentConfiguration`` a replay executes.
        """
        raise NotImplementedError(f"{type(self).__name__} must define derived(params)")

    def baseline(self) -> ExperimentConfiguration:
        """The configuration speedups are measured against (usually the recorded launch).

        Returns:
            The ``ExperimentConfiguration``.
        """
        raise NotImplementedError(f"{type(self).__name__} must define baseline()")

    def describe_extra(self) -> dict[str, Any]:
        """Anything a subclass wants in ``search_space.json`` beside the dimensions.

        Returns:
            A dict (empty by default).
        """
        return {}


def dimensions_of(space: SearchSpace) -> dict[str, Param]:
    """The space's dimensions as an ordered name -> Param dict, checked.

    Args:
        space: the search space.

    Returns:
        The dict.

    Raises:
        ConfigurationError: the dimensions are not parameters, or two share a name.
    """
    dims = space.dimensions()
    if isinstance(dims, Mapping):
        items = list(dims.items())
    elif isinstance(dims, Sequence):
        items = [(getattr(p, "name", None), p) for p in dims]
    else:
        raise ConfigurationError(
            f"{type(space).__name__}.dimensions() must return a dict name -> parameter, got {type(dims).__name__}"
        )
    out: dict[str, Param] = {}
    for key, param in items:
        if not isinstance(param, Param):
            raise ConfigurationError(
                f"{type(space).__name__}: dimension {key!r} is {param!r}, not a parameter type "
                "(IntRangeParam, CategoricalParam, BoolParam, RealParam, PipelineParam, FixedParam)"
            )
        if key != param.name:
            raise ConfigurationError(
                f"{type(space).__name__}: dimension key {key!r} differs from the parameter's name {param.name!r}"
            )
        if key in out:
            raise ConfigurationError(f"{type(space).__name__}: dimension {key!r} is declared twice")
        out[key] = param
    if not out:
        raise ConfigurationError(f"{type(space).__name__}.dimensions() is empty; declare at least one parameter")
    return out


def constraints_checked(space: SearchSpace, params: Mapping[str, Any]) -> bool:
    """``space.constraints(params)``; a crash names the space.

    Args:
        space: the search space.
        params: the sample.

    Returns:
        The constraint's answer.

    Raises:
        ConfigurationError: the space's ``constraints`` raised.
    """
    try:
        return bool(space.constraints(dict(params)))
    except MnemeError:
        raise
    except Exception as exc:
        raise ConfigurationError(
            f"{type(space).__name__}.constraints({dict(params)}) raised {type(exc).__name__}: {exc}; "
            "fix the search space"
        ) from exc


def space_size(space: SearchSpace) -> int | None:
    """Number of points of the grid (before constraints); None when a dimension is continuous.

    Args:
        space: the search space.

    Returns:
        The number of points, or None.
    """
    total = 1
    for param in dimensions_of(space).values():
        size = param.size()
        if size is None:
            return None
        total *= size
    return total


def iterate_points(space: SearchSpace) -> Iterator[dict[str, Any]]:
    """Every point of the grid, the last dimension varying fastest (as the reference prints them).

    Args:
        space: the search space (every dimension finite).

    Returns:
        An iterator of dicts: parameter name -> value.
    """
    import itertools

    dims = dimensions_of(space)
    names = list(dims)
    for combo in itertools.product(*(dims[n].values() for n in names)):
        yield dict(zip(names, combo))


def code_variants(space: SearchSpace, max_variants: int = 256, max_points: int = 20_000) \
        -> list[ExperimentConfiguration]:
    """One configuration per distinct code (``code_knobs``) among the space's points that its constraints
    admit, in the grid's order: what a tuning run can compile ahead, before its first trial. Empty when
    the space is continuous, has more than ``max_points`` points, or more than ``max_variants`` codes
    (a sampler then explores a part of them: each compiles when first replayed).

    Args:
        space: the search space.
        max_variants: at most this many codes, else none.
        max_points: at most this many points, else none.

    Returns:
        The configurations, one per code.
    """
    size = space_size(space)
    if size is None or size > max_points:
        return []
    variants: dict[str, ExperimentConfiguration] = {}
    for params in iterate_points(space):
        if not constraints_checked(space, params):
            continue
        config = derive_checked(space, params)
        variants.setdefault(config.code_key(), config)
        if len(variants) > max_variants:
            return []
    return list(variants.values())


def derive_checked(space: SearchSpace, params: Mapping[str, Any]) -> ExperimentConfiguration:
    """``space.derived(params)``, insisting on an ExperimentConfiguration; a crash names the space.

    Args:
        space: the search space.
        params: the sample.

    Returns:
        The configuration.

    Raises:
        ConfigurationError: ``derived`` raised or returned something else.
    """
    try:
        config = space.derived(dict(params))
    except MnemeError:
        raise
    except Exception as exc:
        raise ConfigurationError(
            f"{type(space).__name__}.derived({dict(params)}) raised {type(exc).__name__}: {exc}; fix the search space"
        ) from exc
    if not isinstance(config, ExperimentConfiguration):
        raise ConfigurationError(
            f"{type(space).__name__}.derived() returned {type(config).__name__}; "
            "return ExperimentConfiguration.from_dict({...})"
        )
    return config


def baseline_checked(space: SearchSpace) -> ExperimentConfiguration:
    """``space.baseline()``, insisting on a valid ExperimentConfiguration.

    Args:
        space: the search space.

    Returns:
        The baseline configuration.

    Raises:
        ConfigurationError: ``baseline`` returned something else, or an invalid configuration.
    """
    try:
        config = space.baseline()
    except MnemeError:
        raise
    except Exception as exc:
        raise ConfigurationError(
            f"{type(space).__name__}.baseline() raised {type(exc).__name__}: {exc}; fix the search space"
        ) from exc
    if not isinstance(config, ExperimentConfiguration):
        raise ConfigurationError(
            f"{type(space).__name__}.baseline() returned {type(config).__name__}; "
            "return ExperimentConfiguration.from_dict({...})"
        )
    problems = config.validation_errors()
    if problems:
        raise ConfigurationError(
            f"{type(space).__name__}.baseline() is not a valid configuration: {'; '.join(problems)}"
        )
    return config


def baseline_params(space: SearchSpace, max_points: int = 20_000) -> dict[str, Any] | None:
    """The parameters of the point of ``space`` whose configuration is the baseline's (same grounded
    hash), or None when there is none (or the space is continuous or larger than ``max_points`` and does
    not say: a space may define ``baseline_params()``, which is checked, to spare the search).

    Args:
        space: the search space.
        max_points: the most points searched.

    Returns:
        The point's parameters, or None.
    """
    target = baseline_checked(space).ground().hash()

    def derives_baseline(params: Mapping[str, Any]) -> bool:
        return constraints_checked(space, params) and derive_checked(space, params).ground().hash() == target

    dims = dimensions_of(space)
    own = getattr(space, "baseline_params", None)
    if callable(own):
        params = own()
        if params is not None and set(params) == set(dims) and all(dims[n].contains(v) for n, v in params.items()) \
                and derives_baseline(params):
            return dict(params)
    size = space_size(space)
    if size is None or size > max_points:
        return None
    return next((params for params in iterate_points(space) if derives_baseline(params)), None)


def describe_space(space: SearchSpace) -> dict[str, Any]:
    """The JSON description written to ``search_space.json`` and printed by ``--print-space``.

    Args:
        space: the search space.

    Returns:
        The description: dimensions, size and the space's extras.
    """
    dims = dimensions_of(space)
    baseline = baseline_checked(space)
    return {
        "class": f"{type(space).__module__}.{type(space).__qualname__}",
        "dimensions": {name: p.describe() for name, p in dims.items()},
        "size": space_size(space),
        "baseline": baseline.to_dict(),
        **space.describe_extra(),
    }


@dataclass(frozen=True)
class Candidate:
    """A sampled point: its parameters and the configuration they derive.

    Attributes:
        params: the sample: parameter name -> value.
        configuration: the configuration it derives.
        number: the sampler's trial number (Optuna), or the enumeration index.
        extra: what the sampler adds to the trial record.
    """

    params: dict[str, Any]
    configuration: ExperimentConfiguration
    number: int = -1  # the sampler's trial number (Optuna), or the enumeration index
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def hash(self) -> str:
        """The grounded configuration's hash, made once (kept in the instance's __dict__: the loop and the
        strategy ask several times per trial, and functools.cached_property's lock costs more)."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = self.__dict__["_hash"] = self.configuration.ground().hash()
        return cached
