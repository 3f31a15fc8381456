"""Shared test set-up: the ``gpu`` marker skips, with the reason, where no GPU is usable."""

from __future__ import annotations

import pytest

from mneme.testing.gpu import gpu_unavailable_reason


def pytest_collection_modifyitems(config, items):
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
