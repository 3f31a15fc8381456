"""Replay of recorded kernel instances: the policy layer over the native engine.

``Replayer(recording, record_id, device=0)`` restores one instance on a GPU and
runs configurations (``run(config, iterations, warmup) -> ExperimentResult``);
``self_test(device)`` checks that this process can launch and verify at all;
``mneme.replay.compile.compile_for`` produces a configuration's code on the
CPU. Importing this package touches no CUDA (the compile pool imports it).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Replayer", "self_test", "driver_available"]


def __getattr__(name: str) -> Any:
    if name == "Replayer":
        from mneme.replay.replayer import Replayer

        return Replayer
    if name == "self_test":
        from mneme.replay.selftest import self_test

        return self_test
    if name == "driver_available":
        from mneme.replay.engine import driver_available

        return driver_available
    raise AttributeError(f"module 'mneme.replay' has no attribute {name!r}")
