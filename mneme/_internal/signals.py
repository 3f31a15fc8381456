"""An application mneme runs on the user's behalf gets the user's signals, and its exit status is theirs.

``mneme record`` and ``mneme run --apply`` start the user's application as a child process. Ctrl-C,
a batch system's SIGTERM, SIGHUP and SIGQUIT are passed on to it while it runs; when mneme stops
watching it, an application still running is killed, so nothing outlives the command.
"""

from __future__ import annotations

import signal
import subprocess

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def forward_signals(proc: subprocess.Popen) -> dict:
    """Pass Ctrl-C, SIGTERM, SIGHUP and SIGQUIT on to ``proc``.

    Args:
        proc: the application.

    Returns:
        The previous handlers, for :func:`restore_signals`.
    """

    def forward(signum, _frame):
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    return {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}


def wait_for(proc: subprocess.Popen, slice_s: float = 0.2) -> int:
    """``proc.wait()`` in slices: a signal the kernel hands to another thread of this process does not
    interrupt a wait without a time-out, and Python runs its handler (the forward) only once the main
    thread looks again.

    Args:
        proc: the application.
        slice_s: the longest a forwarded signal waits.

    Returns:
        Its return code.
    """
    while True:
        try:
            return proc.wait(timeout=slice_s)
        except subprocess.TimeoutExpired:
            continue


def restore_signals(previous: dict, proc: subprocess.Popen) -> None:
    """Undo :func:`forward_signals`; an application still running then is killed (nothing outlives the run).

    Args:
        previous: what :func:`forward_signals` returned.
        proc: the application.
    """
    for s, handler in previous.items():
        signal.signal(s, handler)
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def exit_status(returncode: int) -> int:
    """The status a shell reports for a child's ``returncode``: a death by signal N is 128+N.

    Args:
        returncode: ``Popen.returncode`` (negative for a signal).

    Returns:
        The exit status to pass on.
    """
    return 128 - returncode if returncode < 0 else returncode
