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

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from mneme.errors import Terminated

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Run the block with SIGINT and SIGTERM held; those that came meanwhile are delivered at its end.

    Outside the main thread the block runs unguarded.
    """
    if not _in_main_thread():
        yield
        return
    held: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: held.append(signum)) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(held):
            signal.raise_signal(s)  # the handler the block replaced sees it now
