"""Tune a recorded vector add over block size x LLVM pipeline, exhaustively.

    python examples/tuning_vecadd_exhaustive.py --record-db DIR/<static>.json [--record-id <dynamic>]

(``--record-id`` may be left out when the database holds one instance) or,
with the same search space, through the CLI:

    mneme tune -rdb DIR/<static>.json [-rid <dynamic>] \\
        --space-module examples/tuning_vecadd_exhaustive.py:EntireSpace --sampler exhaustive

Every candidate keeps the recorded work covered: the grid is recomputed from
the number of threads the recorded launch ran along x. Pipelines other than
``default<O3>`` need a recording with LLVM bitcode (an instrumented build);
on a plain nvcc recording they come back as compile errors and are listed as
such.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from mneme.async_executor import AsyncReplayExecutor
from mneme.mneme_types import ExperimentConfiguration, ExperimentResult
from mneme.recorded_execution import RecordedExecution
from mneme.tuning.sample_strategy import ExhaustiveSamplingStrategy
from mneme.tuning.search_space import CategoricalParam, IntRangeParam, SearchSpace

PIPELINES = ["default<O1>", "default<O2>", "default<O3>", "default<Os>", "default<Oz>"]


class EntireSpace(SearchSpace):
    """blockDim.x in 64..1024 (step 64) times the five default pipelines."""

    def __init__(self, recorded_kernel: RecordedExecution.KernelInstance):
        self.kernel = recorded_kernel
        self.threads_x = recorded_kernel.grid_dim.x * recorded_kernel.block_dim.x

    def dimensions(self):
        return {
            "block_dim_x": IntRangeParam("block_dim_x", low=64, high=1024, step=64),
            "passes": CategoricalParam("passes", PIPELINES),
        }

    def constraints(self, params) -> bool:
        return True

    def derived(self, params) -> ExperimentConfiguration:
        return ExperimentConfiguration.from_dict({**self._launch(params["block_dim_x"]), "passes": params["passes"]})

    def baseline(self) -> ExperimentConfiguration:
        return ExperimentConfiguration.from_dict(self._launch(self.kernel.block_dim.x))

    def _launch(self, block_x: int) -> dict:
        grid, block = self.kernel.grid_dim, self.kernel.block_dim
        return {
            "grid": {"x": -(-self.threads_x // block_x), "y": grid.y, "z": grid.z},
            "block": {"x": block_x, "y": block.y, "z": block.z},
            "shared_mem": self.kernel.shared_mem,
        }


def mean_time(result: ExperimentResult) -> float:
    """Mean of the measured launches (warm-ups excluded)."""
    return statistics.mean(result.measured_times)


def tune(executor: AsyncReplayExecutor, space: EntireSpace) -> int:
    baseline = executor.evaluate(space.baseline())
    if not baseline.verified:
        print(f"baseline did not verify ({baseline.status}: {baseline.error}); nothing to compare against")
        return 1
    baseline_time = mean_time(baseline)
    print(f"baseline {space.baseline()}: mean {baseline_time:.0f} ns")

    started = time.perf_counter()
    candidates = [config for config in ExhaustiveSamplingStrategy(space) if config.is_valid()]
    futures = [(config, executor.submit(config)) for config in candidates]
    verified = []
    for index, (config, future) in enumerate(futures):
        result = future.result()
        label = f"[{index}] passes={config.passes} blockDim.x={config.block.x}"
        if result.verified:
            verified.append((mean_time(result), config))
            print(f"{label} mean={mean_time(result):.0f} speedup={baseline_time / mean_time(result):.3f}")
        else:
            print(f"{label} FAILED {result.status}: {result.error}")
    elapsed = time.perf_counter() - started
    print(f"{len(candidates)} configurations in {elapsed:.2f} s ({len(candidates) / elapsed:.1f}/s)")

    if not verified:
        print("no configuration verified")
        return 2
    best_time, best = min(verified, key=lambda entry: entry[0])
    print(f"BEST: passes={best.passes} blockDim.x={best.block.x} mean={best_time:.0f} "
          f"speedup={baseline_time / best_time:.3f}")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record-db", required=True, help="the recording database, <static-hash>.json")
    parser.add_argument("--record-id", help="the instance (dynamic hash) to tune; default: the only one")
    parser.add_argument("--workers", type=int, default=1, help="concurrent replay workers")
    args = parser.parse_args(argv)

    kernel = RecordedExecution.from_json(args.record_db).select(args.record_id)
    with AsyncReplayExecutor(record_db=args.record_db, record_id=kernel.record_id, iterations=5,
                             results_db_dir="./results", num_workers=args.workers) as executor:
        return tune(executor, EntireSpace(kernel))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
