"""A tuning run written by the real tuner on the synthetic vector-add recording, for the apply tests.

The replays are a small deterministic executor (the tests run without a GPU):
its times favour 128 threads per block, and one block shape computes a wrong
answer, so a verified best and an unverified trial are both real outcomes of
the run.
"""

from __future__ import annotations

import concurrent.futures as cf
import io
from pathlib import Path

from mneme.model.experiment import ExperimentConfiguration, ExperimentResult
from mneme.testing.synthetic import write_vecadd_recording
from tuner.options import resolve_options
from tuner.run import run_tune

WRONG_BLOCK_X = 64  # replays of this block shape do not verify


class ShapeExecutor:
    """Times from the block size; ``submit``/``evaluate``/``shutdown`` as the tuner expects."""

    def __init__(self, all_wrong: bool = False):
        self.pool = cf.ThreadPoolExecutor(max_workers=1)
        self.all_wrong = all_wrong

    def evaluate(self, config: ExperimentConfiguration) -> ExperimentResult:
        threads = config.block.count
        t = 50_000 + abs(threads - 128) * 100
        if config.block.x == WRONG_BLOCK_X:
            t = 1_000  # fast and wrong: must never be the best
        wrong = config.block.x == WRONG_BLOCK_X or (self.all_wrong and config.block.x != 256)
        return ExperimentResult(exec_time=[t] * 7, warmup=2, executed=True, verified=not wrong,
                                status="failed_verification" if wrong else "verified",
                                error="output differs" if wrong else "")

    def submit(self, config: ExperimentConfiguration) -> cf.Future:
        return self.pool.submit(self.evaluate, config)

    def shutdown(self) -> None:
        self.pool.shutdown()


def tuned_run(tmp_path: Path, *, name: str = "run", all_wrong: bool = False, **settings) -> Path:
    """Record (synthetically) and tune the vector add; returns the results directory."""
    rec = write_vecadd_recording(tmp_path / f"rec-{name}", n=4096, block=256)
    settings.setdefault("space_preset", "launch")
    settings.setdefault("launch_dim", "x")
    settings.setdefault("launch_safety", "aggressive")
    settings.setdefault("fixed_codegen_opt", 3)
    options = resolve_options({"record_database": rec.path, "record_id": rec.dynamic_hash,
                               "results_dir": str(tmp_path / name), "sampler": "exhaustive", **settings})
    executor = ShapeExecutor(all_wrong)
    run_tune(options, executor_factory=lambda o, d, ahead: executor, out=io.StringIO(), is_tty=False)
    return tmp_path / name
