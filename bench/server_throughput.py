"""Verified configurations per second through the replay servers.

The reference's vector-add space: 5 compile variants x 16 block sizes
(64..1024 step 64) = 80 configurations, 5 iterations + 2 warm-ups each. The
reference ran it in 7.09 s on one GPU: 11.3 configurations/s. This runs the
same space through ``AsyncReplayExecutor`` and local ``mneme serve`` servers,
on one GPU and (when present) on two, and prints one table with the
reference's number beside ours, measured in the same run.

The compile variants are the LLVM pipelines ``default<O1..Oz>`` when the
recording has bitcode; the synthetic recording used here has PTX and cubin
only, so they are ``codegen_opt`` 0..4 (the PTX tier, ptxas in the servers'
compile pools, cold caches). The sweep is timed after a baseline replay, as
the reference's "Total tuning time" is: server start-up is reported apart.

    python bench/server_throughput.py                  # 1 GPU, and 2 if present
    python bench/server_throughput.py --workers-per-gpu 3 --n 4194304

Targets: >= 100 configurations/s on one GPU; >= 1.8x that on two.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # a source checkout is the fallback: an installed mneme (with its native parts) wins

from mneme.async_executor import AsyncReplayExecutor  # noqa: E402
from mneme.mneme_types import ExperimentConfiguration  # noqa: E402

REFERENCE_SECONDS = 7.09
REFERENCE_CONFIGS = 80
PASSES = ["default<O1>", "default<O2>", "default<O3>", "default<Os>", "default<Oz>"]


def space(n: int, has_bitcode: bool) -> tuple[list[ExperimentConfiguration], str]:
    """The 80 configurations, in the reference example's order (variant fastest)."""
    configs = []
    for block_x in range(64, 1025, 64):
        grid = {"x": -(-n // block_x), "y": 1, "z": 1}
        for variant in range(5):
            knobs = {"passes": PASSES[variant]} if has_bitcode else {"codegen_opt": variant}
            configs.append(ExperimentConfiguration.from_dict({"grid": grid, "block": {"x": block_x}, **knobs}))
    return configs, ("passes default<O1..Oz>" if has_bitcode else "codegen_opt 0..4 (PTX tier)")


def sweep(args, database: str, record_id: str, gpus: list[int], configs, mode: str, workdir: Path) -> dict:
    os.environ["MNEME_CACHE_DIR"] = str(workdir / f"cache-{len(gpus)}gpu-{mode}")  # cold compile caches
    started = time.perf_counter()
    extra = {}
    if args.engine:
        extra = {"server_args": ["--engine", args.engine], "server_env": json.loads(args.engine_env or "{}")}
    executor = AsyncReplayExecutor(
        record_db=database, record_id=record_id, iterations=args.iterations, warmup=args.warmup,
        results_db_dir=str(workdir / f"results-{len(gpus)}gpu-{mode}"), num_workers=len(gpus) * args.workers_per_gpu,
        local_gpus=gpus, **extra,
    )
    try:
        baseline = executor.evaluate(ExperimentConfiguration.from_dict({
            "grid": {"x": -(-args.n // 256)}, "block": {"x": 256}}))
        startup = time.perf_counter() - started
        if not baseline.verified:
            raise SystemExit(f"the baseline did not verify: {baseline.status}: {baseline.error}")
        start = time.perf_counter()
        if mode == "sequential":  # the reference example's loop: evaluate one at a time
            results = [executor.evaluate(c) for c in configs]
        else:  # the tuner's way: everything in flight, gathered as it completes
            results = [f.result() for f in [executor.submit(c) for c in configs]]
        seconds = time.perf_counter() - start
    finally:
        executor.shutdown()
    verified = [r for r in results if r.verified]
    failures = sorted({f"{r.status}: {r.error[:80]}" for r in results if not r.verified})
    return {
        "gpus": len(gpus), "mode": mode, "configs": len(results), "verified": len(verified), "seconds": seconds,
        "rate": len(verified) / seconds, "startup": startup, "failures": failures,
        "kernel_us": statistics.median(statistics.mean(r.measured_times) for r in verified) / 1e3 if verified else 0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1 << 20, help="vector length of the synthetic recording (default 2^20)")
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--workers-per-gpu", type=int, default=2, help="worker processes per GPU (default 2)")
    p.add_argument("--gpus", type=int, default=None, help="GPUs to use at most (default: all visible, up to 2)")
    p.add_argument("--modes", default="sequential,concurrent", help="sequential (reference loop), concurrent")
    p.add_argument("--engine", default=None, help="replay engine module:factory (plumbing dry-runs without a GPU)")
    p.add_argument("--engine-env", default=None, help="JSON environment for --engine servers")
    args = p.parse_args(argv)

    from mneme.format.synthetic import write_vecadd_recording
    from mneme.recorded_execution import RecordedExecution

    if args.gpus is not None:
        visible = args.gpus
    else:
        from replay_server.device_info import visible_gpu_count

        visible = min(visible_gpu_count(), 2)
    if visible < 1:
        print("no GPU visible: this benchmark needs one (or --engine and --gpus for a plumbing dry run)")
        return 1
    with tempfile.TemporaryDirectory(prefix="mneme-bench-") as tmp:
        workdir = Path(tmp)
        recording = write_vecadd_recording(str(workdir / "rec"), n=args.n, block=256)
        has_bitcode = RecordedExecution.from_json(recording.path).code.bitcode is not None
        configs, variants = space(args.n, has_bitcode)
        rows = []
        for count in sorted({1, visible}):
            for mode in args.modes.split(","):
                rows.append(sweep(args, recording.path, recording.dynamic_hash, list(range(count)), configs, mode,
                                  workdir))
    print(f"\nvector add, n={args.n}: 80 configurations = 16 block sizes x 5 compile variants ({variants}), "
          f"{args.iterations} iterations + {args.warmup} warm-ups, {args.workers_per_gpu} workers per GPU\n")
    print(f"| {'setup':<34} | verified | seconds | configs/s | vs reference | start-up s | kernel us |")
    print(f"|{'-' * 36}|----------|---------|-----------|--------------|------------|-----------|")
    reference_rate = REFERENCE_CONFIGS / REFERENCE_SECONDS
    print(f"| {'reference (Mneme/HIP, 1 GPU)':<34} | {REFERENCE_CONFIGS:>8} | {REFERENCE_SECONDS:>7.2f} | "
          f"{reference_rate:>9.1f} | {1.0:>11.1f}x | {'':>10} | {'':>9} |")
    for row in rows:
        setup = f"mneme, {row['gpus']} GPU, {row['mode']}"
        print(f"| {setup:<34} | {row['verified']:>5}/{row['configs']:<2} | {row['seconds']:>7.2f} | "
              f"{row['rate']:>9.1f} | {row['rate'] / reference_rate:>11.1f}x | {row['startup']:>10.2f} | "
              f"{row['kernel_us']:>9.1f} |")
    for mode in args.modes.split(","):
        one = next((r for r in rows if r["gpus"] == 1 and r["mode"] == mode), None)
        two = next((r for r in rows if r["gpus"] == 2 and r["mode"] == mode), None)
        if one and two:
            target = " (target >= 1.8x)" if mode == "concurrent" else " (one at a time: a second GPU cannot help)"
            print(f"\n2 GPUs / 1 GPU ({mode}): {two['rate'] / one['rate']:.2f}x{target}")
    best_one = max((r["rate"] for r in rows if r["gpus"] == 1), default=0)
    print(f"best on 1 GPU: {best_one:.1f} configs/s (target >= 100)")
    for row in rows:
        for failure in row["failures"]:
            print(f"  not verified ({row['gpus']} GPU, {row['mode']}): {failure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
