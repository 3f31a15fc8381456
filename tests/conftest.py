"""Shared test set-up: the ``gpu`` marker skips, with the reason, where no GPU is usable; benchmarks write no result files."""

from __future__ import annotations

import os

import pytest

from mneme.testing.gpu import gpu_unavailable_reason


def pytest_configure(config):
    # A benchmark run by a test writes no result file into bench/results/ (bench/results_file.py).
    os.environ.setdefault("MNEME_BENCH_RESULTS", "off")


def pytest_collection_modifyitems(config, items):
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
