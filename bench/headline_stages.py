"""The headline's GPU stages, each run in its own child process.

``python bench/headline_stages.py STAGE --json-out FILE ...`` runs one stage
and writes its measurements as JSON. bench/headline.py starts one process per
stage with a time limit, so a replay that destroys its CUDA context, crashes
the interpreter or hangs costs that stage and nothing else.

Stages:

* ``fidelity``: replay the recorded baseline in-process with
  ``mneme.replay.Replayer`` and report its kernel times, to be set against the
  application's own kernel time.
* ``tune``: sweep a search space through
  ``replay_server.client.executor.AsyncReplayExecutor`` and report verified
  configurations per second and the best speedup.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

# The reference tunes these five pipelines (LLVM tier, kernels with bitcode).
PIPELINES = ("default<O1>", "default<O2>", "default<O3>", "default<Os>", "default<Oz>")
# Without bitcode the PTX tier's five JIT optimization levels are the compile variants.
CODEGEN_LEVELS = (0, 1, 2, 3, 4)

# blockDim.x candidates per space; the grid is recomputed so that every
# configuration covers the recorded launch's threads (ceil(total / block)), as
# the tuner's built-in space and bench/server_throughput.py do. (The reference's
# example keeps the recorded grid, which leaves work undone below the recorded
# block size; a replay that verifies catches that, so those configurations
# would only count as failures.)
SPACES = {
    # The reference's vector-add space: blockDim.x 64..1024 step 64.
    "reference_vecadd": list(range(64, 1025, 64)),
    # The CG solver's SpMV: blockDim.x 32..1024 step 32.
    "spmv": list(range(32, 1025, 32)),
}


def make_space(name: str, kernel: Any, has_bitcode: bool):
    """A ``SearchSpace`` over block size x compile variant, built from the recorded launch."""
    from mneme.model.experiment import ExperimentConfiguration
    from tuner.space.search_space import CategoricalParam, SearchSpace

    if name not in SPACES:
        raise ValueError(f"unknown space {name!r}; known: {', '.join(SPACES)}")
    blocks = SPACES[name]
    grid = kernel.grid_dim
    block = kernel.block_dim
    shared_mem = kernel.shared_mem
    compile_key, variants = ("passes", list(PIPELINES)) if has_bitcode else ("codegen_opt", list(CODEGEN_LEVELS))

    class BlockByCompileSpace(SearchSpace):
        """blockDim.x x compile variant; y, z and shared memory as recorded, grid covering the work."""

        def dimensions(self):
            return {
                "block_dim_x": CategoricalParam("block_dim_x", blocks),
                compile_key: CategoricalParam(compile_key, variants),
            }

        def _grid_x(self, block_x: int) -> int:
            return -(-(grid.x * block.x) // block_x)

        def derived(self, params: Mapping[str, Any]):
            return ExperimentConfiguration.from_dict({
                "grid": {"x": self._grid_x(params["block_dim_x"]), "y": grid.y, "z": grid.z},
                "block": {"x": params["block_dim_x"], "y": block.y, "z": block.z},
                "shared_mem": shared_mem,
                compile_key: params[compile_key],
            })

        def baseline(self):
            return ExperimentConfiguration.from_dict(
                {"grid": grid.to_dict(), "block": block.to_dict(), "shared_mem": shared_mem}
            )

    return BlockByCompileSpace(), compile_key


def baseline_configuration(kernel: Any):
    """The recorded launch with every other knob at its default (the application's own kernel)."""
    from mneme.model.experiment import ExperimentConfiguration

    return ExperimentConfiguration.from_dict(
        {"grid": kernel.grid_dim.to_dict(), "block": kernel.block_dim.to_dict(), "shared_mem": kernel.shared_mem}
    )


def time_summary(times_ns: Sequence[int]) -> dict[str, float]:
    """Mean, median and minimum of kernel times, in microseconds."""
    if not times_ns:
        return {}
    return {
        "mean_us": statistics.mean(times_ns) / 1000.0,
        "median_us": statistics.median(times_ns) / 1000.0,
        "min_us": min(times_ns) / 1000.0,
        "samples": len(times_ns),
    }


def _measured(result: Any) -> list[int]:
    times = list(result.exec_time)
    return times[result.warmup :] if result.warmup and len(times) > result.warmup else times


def run_fidelity(database: str, record_id: str, iterations: int, warmup: int) -> dict[str, Any]:
    """Replay the recorded baseline ``iterations`` times after ``warmup`` launches."""
    from mneme.recording.execution import RecordedExecution

    recording = RecordedExecution.from_json(database)
    kernel = recording[record_id]
    from mneme.replay import (
        Replayer,  # after the recording: a bad database is the first thing to report
    )
    config = baseline_configuration(kernel)
    start = time.perf_counter()
    replayer = Replayer(recording, record_id)
    prepare_s = time.perf_counter() - start
    start = time.perf_counter()
    result = replayer.run(config, iterations=iterations, warmup=warmup)
    run_s = time.perf_counter() - start
    close = getattr(replayer, "close", None)
    if callable(close):
        close()
    return {
        "config": config.to_dict(),
        "verified": bool(result.verified),
        "status": result.status,
        # "error" marks a failed stage for headline.py: present only when the replay reported one
        **({"error": result.error} if result.error else {}),
        "replay": time_summary(_measured(result)),
        "prepare_s": prepare_s,
        "run_s": run_s,
        "result": result.to_dict(),
    }


def _executor(database: str, record_id: str, iterations: int, warmup: int, workers: int, results_dir: str):
    """An ``AsyncReplayExecutor``, passing ``warmup`` where the executor accepts it."""
    from replay_server.client.executor import AsyncReplayExecutor

    kwargs: dict[str, Any] = dict(
        record_db=database, record_id=record_id, iterations=iterations, results_db_dir=results_dir,
        num_workers=workers,
    )
    if "warmup" in inspect.signature(AsyncReplayExecutor).parameters:
        kwargs["warmup"] = warmup
    return AsyncReplayExecutor(**kwargs)


def _outcome(future: Any) -> Any:
    """The future's ExperimentResult; an exception becomes a failed result (counted, never fatal)."""
    from mneme.model.experiment import STATUS_INTERNAL_ERROR, ExperimentResult

    try:
        return future.result()
    except Exception as exc:
        return ExperimentResult.failure(STATUS_INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")


def run_tuning(database: str, record_id: str, space_name: str, has_bitcode: bool, iterations: int, warmup: int,
               workers: int, results_dir: str, min_configs: int = 0) -> dict[str, Any]:
    """Start an executor on the recording and sweep the space exhaustively (see ``sweep``)."""
    from mneme.recording.execution import RecordedExecution

    kernel = RecordedExecution.from_json(database)[record_id]
    space, compile_key = make_space(space_name, kernel, has_bitcode)
    start = time.perf_counter()
    executor = _executor(database, record_id, iterations, warmup, workers, results_dir)
    try:
        startup_s = time.perf_counter() - start
        out = sweep(executor, space, compile_key, min_configs)
    finally:
        executor.shutdown()
    out.update({"space": space_name, "iterations": iterations, "warmup": warmup, "workers": workers,
                "startup_s": startup_s})
    return out


def sweep(executor: Any, space: Any, compile_key: str, min_configs: int = 0) -> dict[str, Any]:
    """Replay the baseline, then every valid configuration of ``space``; count, time, rank.

    Every configuration is submitted at once and the results are gathered as
    they complete, so the executor may pipeline compilation and replay. The
    throughput counts verified configurations over the sweep's wall time,
    apart from the baseline, as the reference's 7.09 s for 80 configurations
    did. The baseline must verify: speedups over a wrong result mean nothing.
    With ``min_configs``, the space is swept again and again until that many
    configurations are in the sweep (a sweep of 80 configurations lasts a
    fraction of a second: fixed latencies and noise would be the rate);
    ``passes`` says how many times.
    """
    from tuner.strategies.sample_strategy import ExhaustiveSamplingStrategy

    space_configs = [c for c in ExhaustiveSamplingStrategy(space) if c.is_valid()]
    passes = max(1, -(-min_configs // len(space_configs))) if space_configs else 1
    configs = space_configs * passes
    start = time.perf_counter()
    baseline = executor.evaluate(space.baseline())
    baseline_s = time.perf_counter() - start
    if not baseline.verified or not _measured(baseline):
        raise RuntimeError(
            f"the baseline replay did not verify ({baseline.status}: {baseline.error}); "
            "tuning against it would mean nothing"
        )
    baseline_mean = statistics.mean(_measured(baseline))

    start = time.perf_counter()
    futures = [executor.submit(c) for c in configs]
    results = [_outcome(f) for f in futures]
    sweep_s = time.perf_counter() - start

    statuses = Counter((r.status or ("verified" if r.verified else "failed")) for r in results)
    verified = [(c, r) for c, r in zip(configs, results) if r.verified and _measured(r)]
    out: dict[str, Any] = {
        "compile_dimension": compile_key,
        "configurations": len(configs),
        "space_configurations": len(space_configs),
        "passes": passes,
        "verified": len(verified),
        "statuses": dict(statuses),
        "baseline_s": baseline_s,
        "sweep_s": sweep_s,
        "configs_per_s": len(configs) / sweep_s if sweep_s > 0 else None,
        "verified_per_s": len(verified) / sweep_s if sweep_s > 0 else None,
        "baseline_mean_us": baseline_mean / 1000.0,
        "first_errors": sorted({r.error for r in results if not r.verified and r.error})[:5],
    }
    if verified:
        best_config, best = min(verified, key=lambda cr: statistics.mean(_measured(cr[1])))
        best_mean = statistics.mean(_measured(best))
        out["best"] = {
            "block_dim_x": best_config.block.x,
            "grid_dim_x": best_config.grid.x,
            compile_key: getattr(best_config, compile_key),
            "mean_us": best_mean / 1000.0,
            "speedup": baseline_mean / best_mean,
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("fidelity", "tune"))
    parser.add_argument("--json-out", required=True)
    parser.add_argument("--database", required=True)
    parser.add_argument("--record-id", required=True)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--space", choices=sorted(SPACES))
    parser.add_argument("--has-bitcode", action="store_true")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--results-dir", default="results")
    parser.add_argument("--min-configs", type=int, default=0, help="sweep the space until this many configurations")
    args = parser.parse_args(argv)
    try:
        if args.stage == "fidelity":
            payload = run_fidelity(args.database, args.record_id, args.iterations, args.warmup)
        else:
            if not args.space:
                parser.error("tune needs --space")
            payload = run_tuning(args.database, args.record_id, args.space, args.has_bitcode, args.iterations,
                                 args.warmup, args.workers, args.results_dir, args.min_configs)
        status = 0
    except Exception as exc:  # reported in the table: the parent shows the message
        payload = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        status = 1
    Path(args.json_out).write_text(json.dumps(payload, indent=2, default=str))
    return status


if __name__ == "__main__":
    sys.exit(main())
