"""Verified configurations per second through the replay servers, one GPU and two side by side.

The reference's vector-add space: 5 compile variants x 16 block sizes
(64..1024 step 64) = 80 configurations, 5 iterations + 2 warm-ups each, on
the reference's recorded launch (grid 40000 x block 256: 10,240,000
elements, the default ``--n``). The reference ran it in 7.09 s on one GPU:
11.3 configurations/s. This runs the
same space through ``AsyncReplayExecutor`` and local ``mneme serve`` servers on
one GPU and on two (when present), in one run, and prints one table with the
reference's number beside ours and the two-GPU / one-GPU ratio.

What is timed: one sweep of the 80 configurations, after a baseline replay and
after the servers prepared the instance (as the reference's "Total tuning
time" is; start-up is reported apart). Every run starts fresh servers with an
empty compile cache directory, so each sweep compiles its variants cold
(``codegen_opt`` 0..4, the PTX tier: nvPTXCompiler, or ptxas, in the servers' compile pools; the
LLVM pipelines ``default<O1..Oz>`` when the recording has bitcode). A sweep
takes a fraction of a second, where fixed latencies weigh, so it is repeated
(``--repeats`` runs of each setup, one-GPU and two-GPU runs interleaved) and
the median and the range are reported. After each cold concurrent sweep, the
same servers run the space ``--warm-passes`` times more at once (compile cache
warm): the steady rate of a long tuning run, shown beside, not the target.
The ratio table also gives, for the cold sweeps, the rate from the moment
every compile variant had its first result to the sweep's end ("cold after
compiles"): the part of a sweep that a second GPU can share, where the start
(a compile and a round trip, the same on one GPU and on two) is not.

``--compile-ahead`` (default ``no,yes``: both, side by side): with ``yes`` the
executor names the space's code variants (``compile_ahead``, as ``mneme tune``
does with its search space), so each server compiles them while it prepares
the instance; the timed sweep then waits for no compile, and the start-up
column shows what preparing took.

    python bench/server_throughput.py                  # 1 GPU, and 2 if present
    python bench/server_throughput.py --repeats 9 --workers-per-gpu 3
    python bench/server_throughput.py --transports stream,unary   # the executor's two transports side by side

Targets: >= 100 configurations/s on one GPU; >= 1.8x that on two (concurrent).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # a source checkout is the fallback: an installed mneme (with its native parts) wins

from mneme.model.experiment import ExperimentConfiguration  # noqa: E402
from replay_server.client.executor import TRANSPORTS, AsyncReplayExecutor  # noqa: E402

REFERENCE_SECONDS = 7.09
REFERENCE_CONFIGS = 80
REFERENCE_N = 40000 * 256  # the reference's recorded launch: grid 40000 x block 256 (its baseline configuration)
PASSES = ["default<O1>", "default<O2>", "default<O3>", "default<Os>", "default<Oz>"]
ONE_GPU_TARGET = 100.0
TWO_GPU_TARGET = 1.8


def space(n: int, has_bitcode: bool) -> tuple[list[ExperimentConfiguration], str]:
    """The 80 configurations, in the reference example's order (variant fastest)."""
    configs = []
    for block_x in range(64, 1025, 64):
        grid = {"x": -(-n // block_x), "y": 1, "z": 1}
        for variant in range(5):
            knobs = {"passes": PASSES[variant]} if has_bitcode else {"codegen_opt": variant}
            configs.append(ExperimentConfiguration.from_dict({"grid": grid, "block": {"x": block_x}, **knobs}))
    return configs, ("passes default<O1..Oz>" if has_bitcode else "codegen_opt 0..4 (PTX tier)")


def client_cpu_seconds() -> float:
    """CPU seconds this process (the client: every thread of it) has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(executor: AsyncReplayExecutor, configs: list, mode: str,
          arrivals: list | None = None) -> tuple[list, float, float]:
    """The sweep, its seconds and the client's CPU seconds in it; ``arrivals`` (if given) gets
    (seconds after start, config, result) per result."""
    cpu = client_cpu_seconds()
    start = time.perf_counter()
    if mode == "sequential":  # the reference example's loop: evaluate one at a time
        results = []
        for c in configs:
            results.append(executor.evaluate(c))
            if arrivals is not None:
                arrivals.append((time.perf_counter() - start, c, results[-1]))
    else:  # the tuner's way: everything in flight, gathered as it completes
        futures = [executor.submit(c) for c in configs]
        if arrivals is not None:
            for c, f in zip(configs, futures):
                f.add_done_callback(lambda f, c=c: arrivals.append((time.perf_counter() - start, c, f.result())))
        results = [f.result() for f in futures]
    return results, time.perf_counter() - start, client_cpu_seconds() - cpu


def variant(config: ExperimentConfiguration) -> str:
    return config.passes if config.passes.strip() != "default<O3>" else f"O{config.codegen_opt}"


def first_results(arrivals: list) -> dict[str, float]:
    """Seconds into the sweep when each compile variant's first result came."""
    first: dict[str, float] = {}
    for seconds, config, _ in arrivals:
        name = variant(config)
        first[name] = min(seconds, first.get(name, seconds))
    return first


def rate_after_compiles(arrivals: list) -> float | None:
    """Configurations/s from the moment every compile variant had its first result to the sweep's end:
    the part of a cold sweep whose work two GPUs can share (None when nothing came after it)."""
    ready = max(first_results(arrivals).values(), default=0.0)
    after = [seconds for seconds, _, result in arrivals if seconds > ready and result.verified]
    return len(after) / (max(after) - ready) if after else None


def timeline(arrivals: list) -> dict:
    """When the cold sweep's results came: the first of each compile variant, and the compiles' own seconds."""
    arrivals = sorted(arrivals, key=lambda a: a[0])
    first = first_results(arrivals)
    compiles = [r.codegen_time for _, _, r in arrivals if r.codegen_time > 0 and not getattr(r, "compile_cached", False)]
    return {"first_result_ms": {k: round(v * 1e3, 1) for k, v in first.items()},
            "compile_ms": sorted(round(c * 1e3, 1) for c in compiles),
            "last_result_ms": round(arrivals[-1][0] * 1e3, 1) if arrivals else 0.0}


def one_run(args, database: str, record_id: str, gpus: int, configs: list, mode: str, transport: str,
            ahead: bool, workdir: Path, index: int) -> list[dict]:
    """Fresh servers on ``gpus`` GPUs, cold compile caches: the timed sweep (and, concurrent, the warm passes).
    ``ahead``: the executor names the space's code variants (``compile_ahead``), so the servers compile
    them while they prepare, before the timed sweep."""
    tag = f"{gpus}gpu-{mode}-{transport}-{'ahead' if ahead else 'cold'}-{index}"
    os.environ["MNEME_CACHE_DIR"] = str(workdir / f"cache-{tag}")  # the servers' compile caches start empty
    local = {"local_gpus": list(range(gpus)), "transport": transport, "server_args": shlex.split(args.server_args)}
    if args.engine:
        local.update(server_args=["--engine", args.engine, *local["server_args"]],
                     server_env=json.loads(args.engine_env or "{}"))
    started = time.perf_counter()
    executor = AsyncReplayExecutor(
        record_db=database, record_id=record_id, iterations=args.iterations, warmup=args.warmup,
        results_db_dir=str(workdir / f"results-{tag}"), num_workers=gpus * args.workers_per_gpu,
        compile_ahead=configs if ahead else (), **connection_arguments(local),
    )
    try:
        baseline = executor.evaluate(ExperimentConfiguration.from_dict({
            "grid": {"x": -(-args.n // 256)}, "block": {"x": 256}}))
        executor.wait_prepared(timeout=300)
        startup = time.perf_counter() - started
        if not baseline.verified:
            raise SystemExit(f"the baseline did not verify: {baseline.status}: {baseline.error}")
        arrivals: list = []
        phases = [("cold", configs, *timed(executor, configs, mode, arrivals))]
        if mode == "concurrent" and args.warm_passes:
            phases.append(("warm", configs * args.warm_passes,
                           *timed(executor, configs * args.warm_passes, mode)))
    finally:
        executor.shutdown()
    rows = []
    for phase, submitted, results, seconds, cpu in phases:
        verified = [r for r in results if r.verified]
        rows.append({
            "gpus": gpus, "mode": mode, "transport": client_setup(transport, ahead), "phase": phase, "ahead": ahead, "configs": len(submitted), "verified": len(verified),
            "seconds": seconds, "rate": len(verified) / seconds, "startup": startup, "client_cpu": cpu / seconds,
            "after_compiles": rate_after_compiles(arrivals) if phase == "cold" else None,
            "per_gpu": collections.Counter(r.gpu_id for r in results),
            "failures": sorted({f"{r.status}: {r.error[:80]}" for r in results if not r.verified}),
            "kernel_us": statistics.median(statistics.mean(r.measured_times) for r in verified) / 1e3
            if verified else 0.0,
        })
        if phase == "cold" and args.timeline:
            print(f"timeline {gpus} GPU {mode} {client_setup(transport, ahead)} run {index}: "
                  f"{json.dumps(timeline(arrivals))}", flush=True)
    return rows


def connection_arguments(settings: dict) -> dict:
    """The executor's keyword arguments for these connection settings: ``connection=ConnectionSettings(...)``,
    or, for an installed mneme from before ``ConnectionSettings``, the loose keywords it took (so that one
    copy of this script measures the code before and after side by side)."""
    try:
        from replay_server.client.connection import ConnectionSettings
    except ImportError:
        return settings
    return {"connection": ConnectionSettings(**settings)}


def client_setup(transport: str, ahead: bool) -> str:
    return f"{transport}, compiled ahead" if ahead else transport


def describe(phase: str, configs: int, warm_passes: int, ahead: bool = False) -> str:
    if phase == "cold":
        return f"{configs} configs, code compiled by Prepare" if ahead else f"{configs} configs, cold compile cache"
    return f"{warm_passes} x {configs // warm_passes} configs, warm cache"


def print_tables(args, rows: list[dict], variants: str) -> None:
    print(f"\nvector add, n={args.n}: 80 configurations = 16 block sizes x 5 compile variants ({variants}), "
          f"{args.iterations} iterations + {args.warmup} warm-ups, {args.workers_per_gpu} workers per GPU; "
          f"each row: the median of its runs (each run: fresh servers, timed after a baseline replay); "
          f"client CPU: the CPU time of this process (the executor's threads) over the row's seconds, "
          f"100% = one core\n")
    print(f"| {'setup':<50} | {'timed in each run':<36} | runs | verified  | configs/s | min..max      "
          f"| vs reference | per GPU     | start-up s | kernel us | client CPU |")
    print(f"|{'-' * 52}|{'-' * 38}|------|-----------|-----------|---------------|--------------|-------------|"
          f"------------|-----------|------------|")
    reference_rate = REFERENCE_CONFIGS / REFERENCE_SECONDS
    print(f"| {'reference (Mneme/HIP, 1 GPU)':<50} | {'80 configs':<36} | {1:>4} | {'80/80':>9} | "
          f"{reference_rate:>9.1f} | {'':<13} | {1.0:>11.1f}x | {'':<11} | {'':>10} | {'':>9} | {'':>10} |")
    groups = collections.defaultdict(list)
    for row in rows:
        groups[(row["transport"], row["mode"], row["phase"], row["gpus"])].append(row)
    medians = {}
    for (transport, mode, phase, gpus), runs in sorted(
            groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != "sequential", kv[0][2], kv[0][3])):
        rates = [r["rate"] for r in runs]
        median = medians[(transport, mode, phase, gpus)] = statistics.median(rates)
        share = sum((r["per_gpu"] for r in runs), collections.Counter())
        per_gpu = "/".join(str(share[g]) for g in sorted(share))
        verified = f"{sum(r['verified'] for r in runs)}/{sum(r['configs'] for r in runs)}"
        setup = f"mneme, {gpus} GPU{'s' if gpus > 1 else ''}, {mode}, {transport}"
        print(f"| {setup:<50} | {describe(phase, runs[0]['configs'], args.warm_passes, runs[0]['ahead']):<36} | "
              f"{len(runs):>4} | "
              f"{verified:>9} | {median:>9.1f} | {f'{min(rates):.0f}..{max(rates):.0f}':<13} | "
              f"{median / reference_rate:>11.1f}x | {per_gpu:<11} | "
              f"{statistics.median(r['startup'] for r in runs):>10.2f} | "
              f"{statistics.median(r['kernel_us'] for r in runs):>9.1f} | "
              f"{statistics.median(r['client_cpu'] for r in runs):>9.0%} |")

    setups = list(dict.fromkeys(row["transport"] for row in rows))
    pairs = [(transport, mode, phase) for transport in setups
             for mode, phase in [("concurrent", "cold"), ("concurrent", "warm"), ("sequential", "cold")]
             if groups.get((transport, mode, phase, 1)) and groups.get((transport, mode, phase, 2))]
    if pairs:
        print(f"\n| {'2 GPUs / 1 GPU':<56} | ratio of medians | run by run (min..max) | target                                 |")
        print(f"|{'-' * 58}|------------------|-----------------------|----------------------------------------|")
    for transport, mode, phase in pairs:
        one, two = groups[(transport, mode, phase, 1)], groups[(transport, mode, phase, 2)]
        ratio = medians[(transport, mode, phase, 2)] / medians[(transport, mode, phase, 1)]
        paired = [b["rate"] / a["rate"] for a, b in zip(one, two)]  # runs were interleaved: pair them
        if (mode, phase) == ("concurrent", "cold"):
            target = f">= {TWO_GPU_TARGET}x: {'met' if ratio >= TWO_GPU_TARGET else 'NOT met'}"
            if one[0]["ahead"]:
                target += ", code compiled ahead"
        elif mode == "sequential":
            target = "none: one at a time"
        else:
            target = "none: steady rate"
        print(f"| {f'{mode}, {phase}, {transport}':<56} | {ratio:>15.2f}x | {f'{min(paired):.2f}..{max(paired):.2f}':<21} | "
              f"{target:<38} |")
        if (mode, phase) != ("concurrent", "cold"):
            continue
        after = [(a["after_compiles"], b["after_compiles"]) for a, b in zip(one, two)
                 if a["after_compiles"] and b["after_compiles"]]
        if after:
            ratio = statistics.median(b for _, b in after) / statistics.median(a for a, _ in after)
            paired = [b / a for a, b in after]
            print(f"| {f'{mode}, cold after compiles, {transport}':<56} | {ratio:>15.2f}x | "
                  f"{f'{min(paired):.2f}..{max(paired):.2f}':<21} | {'none: part of a sweep':<38} |")
    best_one = max((m for (_, mode, phase, gpus), m in medians.items() if gpus == 1 and phase == "cold"), default=0)
    print(f"\nbest median on 1 GPU (cold sweeps): {best_one:.1f} configs/s (target >= {ONE_GPU_TARGET:g}: "
          f"{'met' if best_one >= ONE_GPU_TARGET else 'NOT met'})")
    for row in rows:
        for failure in row["failures"]:
            print(f"  not verified ({row['gpus']} GPU, {row['mode']}, {row['transport']}, {row['phase']}): {failure}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=REFERENCE_N,
                   help="vector length of the synthetic recording (default: the reference's launch, 40000 x 256)")
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--workers-per-gpu", type=int, default=2, help="worker processes per GPU (default 2)")
    p.add_argument("--gpus", type=int, default=None, help="GPUs to use at most (default: all visible, up to 2)")
    p.add_argument("--modes", default="sequential,concurrent", help="sequential (reference loop), concurrent")
    p.add_argument("--transports", default="stream",
                   help="how the executor sends requests: stream, unary, or both to compare (default stream)")
    p.add_argument("--compile-ahead", default="no,yes",
                   help="no: the cold sweep compiles its code variants; yes: the executor names them "
                        "(compile_ahead) and the servers compile them while preparing, before the sweep; "
                        "no,yes (default): both, side by side")
    p.add_argument("--repeats", type=int, default=5, help="runs of each setup, fresh servers each (default 5)")
    p.add_argument("--warm-passes", type=int, default=5,
                   help="passes over the space after each cold concurrent sweep, warm cache (default 5; 0: none)")
    p.add_argument("--timeline", action="store_true",
                   help="print when each cold sweep's first result of every compile variant arrived, and its compiles")
    p.add_argument("--server-args", default="",
                   help="more `mneme serve` arguments for the local servers, as one string (e.g. '--compile-processes 8')")
    p.add_argument("--engine", default=None, help="replay engine module:factory (plumbing dry-runs without a GPU)")
    p.add_argument("--engine-env", default=None, help="JSON environment for --engine servers")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if not set(args.transports.split(",")) <= set(TRANSPORTS):
        p.error(f"--transports: each one of {', '.join(TRANSPORTS)}")
    if not args.compile_ahead or not set(args.compile_ahead.split(",")) <= {"no", "yes"}:
        p.error("--compile-ahead: no, yes, or no,yes")

    from mneme.recording.execution import RecordedExecution
    from mneme.testing.synthetic import write_vecadd_recording

    if args.gpus is not None:
        visible = args.gpus
    else:
        from mneme._internal.devices import visible_gpu_count

        visible = min(visible_gpu_count(), 2)
    if visible < 1:
        print("no GPU visible: this benchmark needs one (or --engine and --gpus for a plumbing dry run)")
        return 1
    if visible < 2:
        print("one GPU visible: the two-GPU rows and the ratio need a machine with two")
    with tempfile.TemporaryDirectory(prefix="mneme-bench-") as tmp:
        workdir = Path(tmp)
        recording = write_vecadd_recording(str(workdir / "rec"), n=args.n, block=256)
        has_bitcode = RecordedExecution.from_json(recording.path).code.bitcode is not None
        configs, variants = space(args.n, has_bitcode)
        rows = []
        for index in range(args.repeats):  # interleaved, so that drift of the machine hits every setup alike
            for mode in args.modes.split(","):
                for transport in args.transports.split(","):
                    for ahead in args.compile_ahead.split(","):
                        for count in sorted({1, visible}):
                            rows += one_run(args, recording.path, recording.dynamic_hash, count, configs, mode,
                                            transport, ahead == "yes", workdir, index)
    print_tables(args, rows, variants)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
