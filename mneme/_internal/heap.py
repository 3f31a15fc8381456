"""Keep Python's cyclic garbage collector off a long-lived heap.

A process that keeps every trial, or every log of a study, holds hundreds of thousands of containers that
live as long as it does. The collector's full passes look at all of them, and take longer the more there
are: in a tuner of 15,000 trials and in the study server they were a third of the CPU. :class:`Heap`
moves what is alive into the collector's permanent generation (``gc.freeze``) once a second at most, so the
collector looks only at what was made since; every ``COLLECT_S`` it looks at everything once (``unfreeze``,
``collect``, ``freeze``), so that cycles which became garbage after they were frozen are freed too.
"""

from __future__ import annotations

import gc
import time

#: How often what is alive is frozen, at most.
FREEZE_S = 1.0
#: How often the frozen heap is collected (its garbage cycles freed).
COLLECT_S = 300.0


class Heap:
    """Call :meth:`settle` between units of work (a loop's round, a server's call): it costs a clock read;
    :meth:`release` when the work is over."""

    def __init__(self) -> None:
        now = time.monotonic()
        self._frozen = now
        self._collected = now

    def settle(self) -> None:
        """Freeze what is alive, once ``FREEZE_S`` passed; collect everything once ``COLLECT_S`` passed."""
        now = time.monotonic()
        if now - self._frozen < FREEZE_S:
            return
        if now - self._collected >= COLLECT_S:
            gc.unfreeze()
            gc.collect()
            self._collected = now
        gc.freeze()
        self._frozen = time.monotonic()

    def release(self) -> None:
        """Give what was frozen back to the collector (the work is over: its garbage is freed as usual)."""
        gc.unfreeze()
