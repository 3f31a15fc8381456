"""mneme: record GPU kernel launches out of CUDA applications, replay them
standalone and bit-exact, and tune them.

The public API lives under the module names users of the reference know:
``mneme.mneme_types``, ``mneme.recorded_execution``, ``mneme.async_executor``,
``mneme.tuning.search_space`` and ``mneme.tuning.sample_strategy``.
"""

__version__ = "0.1.0"
