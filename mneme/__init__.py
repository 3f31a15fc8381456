"""mneme: record GPU kernel launches out of CUDA applications, replay them
standalone and bit-exact, and tune them.

The public API lives under the module names users of the reference know:
``mneme.model.experiment``, ``mneme.recording.execution``, ``replay_server.client.executor``,
``tuner.space.search_space`` and ``tuner.strategies.sample_strategy``.
"""

__version__ = "0.1.0"
