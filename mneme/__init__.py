"""mneme: record GPU kernel launches out of CUDA applications, replay them
standalone and bit-exact, and tune them.

The public API lives in ``mneme.model.experiment``, ``mneme.recording.execution``,
``replay_server.client.executor``, ``tuner.space.search_space`` and ``tuner.strategies.sample_strategy``;
the reference's module names for them (``mneme.mneme_types``, ``mneme.recorded_execution``,
``mneme.async_executor``, ``mneme.tuning.search_space``, ``mneme.tuning.sample_strategy``) are
declared in the distribution's metadata and resolved on first import
(:mod:`mneme._internal.reference_names`), so the core names no package above it.
"""

from mneme._internal.reference_names import install as _install_reference_names

__version__ = "0.1.0"
_install_reference_names()
