"""The reference's tuning API names: :mod:`mneme.tuning.search_space` and
:mod:`mneme.tuning.sample_strategy`, the same modules as :mod:`tuner.space.search_space` and
:mod:`tuner.strategies.sample_strategy` (all of tuning lives in the ``tuner`` package)."""
