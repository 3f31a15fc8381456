"""The tuning API: search spaces (:mod:`mneme.tuning.search_space`) and
sampling strategies (:mod:`mneme.tuning.sample_strategy`)."""
