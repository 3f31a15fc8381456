"""Processes that must not outlive the process that started them.

A client killed with SIGKILL cannot stop the servers it started, and a
supervisor killed that way cannot stop its compile processes; each of those
watches its parent and acts when it is gone (Linux then re-parents it, so
``getppid`` changes). Workers use PR_SET_PDEATHSIG instead (``worker.py``):
they may be stuck in a kernel, where no thread of theirs would run.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable


def when_parent_gone(parent_pid: int, action: Callable[[], None], every: float = 0.5) -> threading.Thread:
    """Run ``action`` in a daemon thread once ``parent_pid`` is no longer this process's parent
    (at once when it is not the parent already)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(every)
        action()

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


def exit_with_parent(parent_pid: int) -> None:
    """Initializer of a compile process: exit at once when ``parent_pid`` is gone (nothing to save)."""
    name_process("mneme-compile")
    when_parent_gone(parent_pid, lambda: os._exit(0))


def name_process(name: str) -> None:
    """Give this process a name that ``ps``, ``top`` and ``/proc/PID/comm`` show (Linux; at most 15
    bytes): a server's workers and compile processes are otherwise all ``python``."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):  # not Linux
        pass
