"""How configurations are chosen: ask/tell strategies over Optuna samplers (``sample_strategy``)
and studies shared by several tuner processes (``shared_study``)."""

from __future__ import annotations

from typing import Any

from mneme.errors import ConfigurationError
from tuner.space.search_space import SearchSpace
from tuner.strategies.sample_strategy import (
    OPTUNA_SAMPLERS,
    ExhaustiveSamplingStrategy,
    OptunaSamplingStrategy,
    SamplingStrategy,
)
from tuner.strategies.shared_study import SharedStudyStrategy

__all__ = ["ExhaustiveSamplingStrategy", "OptunaSamplingStrategy", "SamplingStrategy", "SharedStudyStrategy",
           "make_strategy"]


def make_strategy(space: SearchSpace, sampler: str, **optuna_options: Any) -> SamplingStrategy:
    """The strategy for ``--sampler``: exhaustive enumeration, or an Optuna sampler over a study of this
    process (or, with ``storage``, one shared with other processes: :class:`SharedStudyStrategy`).

    Args:
        space: the search space.
        sampler: ``exhaustive``, or one of ``OPTUNA_SAMPLERS`` (grid, random, tpe, nsga2).
        **optuna_options: :class:`OptunaSamplingStrategy`'s keyword arguments (seed, directions,
            study_name, storage, pruner, ...); exhaustive enumeration needs none.

    Returns:
        The strategy.
    """
    if sampler == "exhaustive":
        return ExhaustiveSamplingStrategy(space)
    if sampler not in OPTUNA_SAMPLERS:
        raise ConfigurationError(
            f"unknown sampler {sampler!r}; choose one of exhaustive, {', '.join(OPTUNA_SAMPLERS)}"
        )
    if optuna_options.get("storage"):  # other processes may share it: claims, user attributes
        return SharedStudyStrategy(space, sampler, **optuna_options)
    optuna_options.pop("results_dir", None)
    return OptunaSamplingStrategy(space, sampler, **optuna_options)
