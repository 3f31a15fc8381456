"""Keep Python's cyclic garbage collector off a long-lived heap.

A process that keeps every trial, or every log of a study, holds hundreds of thousands of containers that
live as long as it does. The collector's full passes look at all of them, and take longer the more there
are: in a tuner of 15,000 trials and in the study server they were a third of the CPU. :class:`Heap`
moves what is alive into the collector's permanent generation (``gc.freeze``) once a second at most, so the
collector looks only at what was made since, and turns the collector's own full passes off while it holds
the heap: between two freezes they looked again and again at everything made since the last (a tuner of
four on one study spent a quarter of its time there), while the young generations, where most garbage
cycles die, are still collected as usual. Every ``COLLECT_S`` it looks at everything once (``unfreeze``,
``collect``, ``freeze``), so that cycles which became garbage after they grew old are freed too.
"""

from __future__ import annotations

import gc
import threading
import time

#: How often what is alive is frozen, at most.
FREEZE_S = 1.0
#: How often the frozen heap is collected (its garbage cycles freed).
COLLECT_S = 300.0
#: The oldest generation's threshold while a heap is held: a full pass never comes on its own.
NO_FULL_PASSES = 2**31 - 1


class Heap:
    """Call :meth:`settle` between units of work (a loop's round, a server's call): it costs a clock read;
    :meth:`release` when the work is over."""

    def __init__(self) -> None:
        now = time.monotonic()
        self._frozen = now
        self._collected = now
        self._holding = False  # whether this heap keeps the collector's full passes off

    def settle(self) -> None:
        """The first call turns the collector's full passes off; then: freeze what is alive, once ``FREEZE_S``
        passed; collect everything once ``COLLECT_S`` passed."""
        now = time.monotonic()
        if not self._holding:
            self._holding = True
            _hold()
        if now - self._frozen < FREEZE_S:
            return
        if now - self._collected >= COLLECT_S:
            gc.unfreeze()
            gc.collect()
            self._collected = now
        gc.freeze()
        self._frozen = time.monotonic()

    def release(self) -> None:
        """Give what was frozen back to the collector, its full passes on again (the work is over: its garbage
        is freed as usual)."""
        gc.unfreeze()
        if self._holding:
            self._holding = False
            _let_go()


_held = 0  # heaps of this process that keep the full passes off
_thresholds: tuple[int, ...] = ()  # the collector's thresholds before the first of them
_lock = threading.Lock()


def _hold() -> None:
    global _held, _thresholds
    with _lock:
        if not _held:
            _thresholds = gc.get_threshold()
            gc.set_threshold(*_thresholds[:2], NO_FULL_PASSES)
        _held += 1


def _let_go() -> None:
    global _held
    with _lock:
        _held -= 1
        if not _held:
            gc.set_threshold(*_thresholds)
