"""The user's signals reach the application mneme runs, whichever thread of mneme the kernel hands them to."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

from mneme._internal.signals import exit_status, forward_signals, restore_signals, wait_for


def test_a_sigterm_handed_to_another_thread_reaches_the_application():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    previous = forward_signals(proc)
    idle = threading.Event()
    helper = threading.Thread(target=idle.wait, args=(30,), daemon=True)  # a thread the signal goes to
    helper.start()
    try:
        started = time.monotonic()
        signal.pthread_kill(helper.ident, signal.SIGTERM)
        code = wait_for(proc)
        assert time.monotonic() - started < 10, "the signal was not passed on while mneme waited"
        assert exit_status(code) == 128 + signal.SIGTERM
    finally:
        idle.set()
        restore_signals(previous, proc)
