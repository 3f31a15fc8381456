"""Retries for transient store errors (network down, server restarting): exponential backoff with jitter."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

from mneme.store.base import StoreUnavailableError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter for transient store errors.

    The defaults ride out about a minute of network trouble per operation
    (0.5, 1, 2, 4, 8, 16, 30 s); the record agent's :class:`Uploader` retries
    whole passes on top of that, for as long as it runs.
    """

    attempts: int = 8
    initial_delay_s: float = 0.5
    max_delay_s: float = 30.0

    def delays(self) -> Iterator[float]:
        delay = self.initial_delay_s
        for _ in range(self.attempts - 1):
            yield min(delay, self.max_delay_s) * random.uniform(0.8, 1.2)
            delay *= 2


def with_retries(action: Callable[[], T], policy: RetryPolicy, sleep: Callable[[float], None] = time.sleep) -> T:
    """Run ``action``; on :class:`StoreUnavailableError` wait and try again, per ``policy``."""
    delays = policy.delays()
    while True:
        try:
            return action()
        except StoreUnavailableError:
            delay = next(delays, None)
            if delay is None:
                raise
            sleep(delay)
