"""Helpers of the scale tests: they reuse the server tests' fake-engine servers and the store tests'
moto S3 server (modules of those folders, put on sys.path here)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
for folder in ("server", "store"):
    if str(TESTS / folder) not in sys.path:
        sys.path.insert(0, str(TESTS / folder))


def wait_until(condition, timeout: float = 20.0, every: float = 0.1):
    """Poll ``condition()`` until it returns something true; that value (or the last false one)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)
