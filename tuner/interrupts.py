"""Hold Ctrl-C across a few statements that must happen together.

A trial is written to ``trials.jsonl`` and counted in the run's state in two
steps; a SIGINT between them would leave a summary that disagrees with the
file (and a ``--resume`` that skips more trials than the summary says were
done). :func:`interrupts_held` delays the signal to the end of such a block.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Run the block with SIGINT held; a signal that came meanwhile is delivered at its end.

    Signal handlers belong to the main thread: elsewhere the block runs unguarded.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            signal.raise_signal(signal.SIGINT)  # the handler the block replaced sees it now
