"""Stopping a tuning run by signal: Ctrl-C (SIGINT) and SIGTERM alike, never half-way through a step.

SIGTERM is what a batch system sends at a job's time limit (then SIGKILL):
:func:`sigterm_as_interrupt` makes it stop the run as Ctrl-C does, so the
summary is written and the servers are stopped. A trial is written to
``trials.jsonl`` and counted in the run's state in two steps; a signal
between them would leave a summary that disagrees with the file (and a
``--resume`` that skips more trials than the summary says were done):
:func:`interrupts_held` delays both signals to the end of such a block.
"""

from __future__ import annotations

import _signal
import signal
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from mneme.errors import Terminated

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_holding = False  # inside interrupts_held (main thread only)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()  # signal handlers belong to it


def _raise_terminated(_signum: int, _frame: object) -> None:
    raise Terminated()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM raises :class:`~mneme.errors.Terminated` (a KeyboardInterrupt)."""
    if not _in_main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Unguarded:
    """The block of a nested (or other thread's) ``interrupts_held``: nothing to do."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_UNGUARDED = _Unguarded()


def interrupts_held() -> AbstractContextManager[None]:
    """Run the block with SIGINT and SIGTERM held; those that came meanwhile are delivered at its end.

    Outside the main thread the block runs unguarded; inside a held block, a nested one costs next to
    nothing (the tuning loop holds them once around a batch of results, and again around each trial's
    write: a generator-based context manager there would cost more than the write).
    """
    if _holding or not _in_main_thread():
        return _UNGUARDED
    return _held()


@contextmanager
def _held() -> Iterator[None]:
    global _holding
    _holding = True
    held: list[int] = []
    # _signal: the C functions under `signal`, without its enum conversions (a third of this block's cost,
    # and the tuning loop enters it for every batch of results).
    previous = {s: _signal.signal(s, lambda signum, _frame: held.append(signum)) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        _holding = False
        for s, handler in previous.items():
            _signal.signal(s, handler)
        for s in dict.fromkeys(held):
            signal.raise_signal(s)  # the handler the block replaced sees it now
