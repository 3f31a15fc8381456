"""One tuning process of a shared study, for the scale tests: ``python tune_process.py SETTINGS_JSON``.

It runs ``mneme tune`` (tuner.run.run_tune) with the tuner tests' deterministic executor, so several
real processes can share one Optuna storage without a GPU.
"""

from __future__ import annotations

import io
import json
import sys

from tuner.options import resolve_options
from tuner.recording import KernelIdentity
from tuner.run import run_tune
from tuner.testing import FakeExecutor, vecadd_kernel


def main() -> int:
    settings = json.loads(sys.argv[1])
    delay = settings.pop("delay", 0.0)
    interrupt_after = settings.pop("interrupt_after", None)
    executor = FakeExecutor(delay=delay, workers=4, interrupt_after=interrupt_after)

    def loader(record_database, record_id):
        return vecadd_kernel(), KernelIdentity("vecAdd", "15941914485064662553", str(record_id))

    try:
        return run_tune(resolve_options(settings), executor_factory=lambda o, d, ahead: executor,
                        instance_loader=loader, out=io.StringIO(), is_tty=False)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
