"""Which engine a server runs: the CUDA engine, a ``module:factory`` reference, or a spec object.

The interface is :mod:`replay_server.server.engine`; implementations depend on it,
and only this module knows them, so the interface never imports an
implementation (no cycle between ``engine`` and ``cuda_engine``).
"""

from __future__ import annotations

import importlib

from mneme.errors import ConfigurationError
from replay_server.server.engine import EngineSpec


def load_engine_spec(reference: "str | EngineSpec | None") -> EngineSpec:
    """The engine a server runs: the CUDA engine, ``module:factory`` (tests, experiments), or a spec object."""
    if reference is not None and not isinstance(reference, str):
        return reference
    if not reference or reference == "cuda":
        from replay_server.server.cuda_engine import CudaEngineSpec

        return CudaEngineSpec()
    module_name, _, attr = reference.partition(":")
    if not attr:
        raise ConfigurationError(f"--engine {reference!r}: give 'cuda' or 'module:factory'")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"--engine {reference!r} cannot be loaded: {exc}") from exc
    return factory()
