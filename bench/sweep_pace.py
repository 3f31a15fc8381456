"""The tuning loop at the GPU's pace: configurations per second against the GPU's floor, on long sweeps.

    python bench/sweep_pace.py                                   # every row, this tree, one GPU
    python bench/sweep_pace.py --compare-tree /tmp/prev-site     # and another mneme beside it, run by run
    PYTHONPATH=$PWD python bench/sweep_pace.py --engine test --configs 300   # no GPU: host work only

Each row is a sweep of at least ``--configs`` configurations (1,000 by default) through
``AsyncReplayExecutor`` and a fresh local ``mneme serve`` on one GPU (``--workers`` worker processes;
an empty compile cache), timed after the baseline replay and the servers' ``Prepare``:

* ``launch``: the reference's vector add (grid 40000 x block 256: ``--n``) over a launch space with one
  code variant, the recorded code: 32 block sizes (32..1024), repeated;
* ``reference``: the reference's space, 5 compile variants (``codegen_opt`` 0..4) x 16 block sizes,
  repeated, its code compiled ahead (``compile_ahead``, as ``mneme tune`` does);
* ``small``: the launch row on a small vector add (``--small-n``: a kernel of ~5 us), where what each
  launch costs beyond the kernel weighs most;
* ``compile``: every configuration with new code: ``--configs`` of the configurations of the ``full``
  preset's space that differ in their code, in random order, nothing compiled ahead (at most the
  space's variants);
* ``tune``: ``mneme tune --space-preset full --sampler random --trials N`` end to end on the same
  recording (its own local server, ``--workers``): trials/s from its first trial to its last, and its
  ratio to the ``compile`` row's rate on the same space (target >= 90%).

Columns: ``configs/s`` (verified configurations over the sweep's wall time); ``kernel us`` and ``mean us``
(the median and the mean measured launch: the compile row's code variants differ widely); ``floor``
(configurations/s if the GPU did only the launches: 1e9 / (launches x mean launch ns), launches =
iterations + warm-ups); ``GPU busy`` (the sum of every measured launch, warm-ups included, over the
sweep's wall time: the fraction of the sweep the GPU spent in the kernel); ``replay floor`` (one
configuration replayed back to back in the bench's own process, no server: engine calls of 8
configurations, each enqueued while the one before runs, as a worker does; what the GPU needs for each
configuration's full reset, launches and comparisons) and the sweep's rate as a fraction of it;
``compile ms`` (the
median compile time of the configurations whose code was compiled during the sweep); host CPU per
configuration of the client (this process: the executor's threads), the server's supervisor, its
workers and its compile processes (``/proc``, over the timed sweep).

``--compare-tree DIR`` runs the same rows with another mneme beside this one, row by row interleaved
(a child process per row and tree, its ``PYTHONPATH`` led by DIR): DIR holds an importable mneme, with
its native parts for GPU runs (``pip install --no-deps --target DIR CHECKOUT``; on the CPU an exported
source tree does). ``--engine test`` runs every row without a GPU: the real replayer, compile pool and
servers over the fake native engine (``replay_server/testing/replayer_engine.py``), each launch taking
the kernel's time (``--test-kernel-us``, ``--test-small-kernel-us``) as a sleep without the interpreter
lock; what it measures is the host's work. The table goes to ``bench/results/sweep_pace.md`` (with
the host, GPU, date and commit) unless ``--no-results-file``.

Targets (one GPU): ``launch`` >= 80% GPU busy; ``small``: the floor and the gap; ``compile`` >= 500
trials/s on a 16-core host; ``tune`` >= 90% of the ``compile`` row.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
sys.path.append(str(REPO))  # a source checkout is the fallback: an installed mneme (with its native parts) wins
sys.path.append(str(HERE.parent))

ROWS = ("launch", "reference", "small", "compile", "tune")
REFERENCE_N = 40000 * 256
SMALL_N = 786432
ENGINE_MODULE = "mneme_pace_engine"  # this tree's replay_server/testing/replayer_engine.py, copied (--engine test)
BUSY_TARGET = 0.80
COMPILE_TARGET = 500.0
TUNE_TARGET = 0.90


# -- one row, in a child process -------------------------------------------------------------------------
def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def descendants(pid: int) -> dict[int, str]:
    """The processes below ``pid`` (children, theirs, ...), with their names (``comm``)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(parent, []).append(int(entry.name))
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            try:
                found[child] = Path(f"/proc/{child}/comm").read_text().strip()
            except OSError:
                continue
            todo.append(child)
    return found


def server_cpu(pids: list[int]) -> dict[str, float]:
    """CPU seconds of the servers ``pids`` by part: supervisor, workers, compile processes."""
    out = {"supervisor": 0.0, "workers": 0.0, "compile": 0.0}
    for pid in pids:
        out["supervisor"] += proc_cpu(pid)
        for child, name in descendants(pid).items():
            part = "workers" if name == "mneme-worker" else "compile" if name == "mneme-compile" else "supervisor"
            out[part] += proc_cpu(child)
    return out


def client_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def launch_space(n: int) -> list:
    from mneme.model.experiment import ExperimentConfiguration

    return [ExperimentConfiguration.from_dict({"grid": {"x": -(-n // b)}, "block": {"x": b}})
            for b in range(32, 1025, 32)]


def reference_space(n: int) -> list:
    from mneme.model.experiment import ExperimentConfiguration

    return [ExperimentConfiguration.from_dict({"grid": {"x": -(-n // b)}, "block": {"x": b}, "codegen_opt": v})
            for b in range(64, 1025, 64) for v in range(5)]


def full_space_variants(database: str, record_id: str, seed: int) -> list:
    """The configurations of the ``full`` preset's space (as ``mneme tune`` builds it) that differ in their
    code, in random order."""
    from tuner.options import TuneOptions
    from tuner.recording import load_instance
    from tuner.space.factory import build_space
    from tuner.strategies.sample_strategy import ExhaustiveSamplingStrategy

    kernel, _ = load_instance(database, record_id)
    space = build_space(TuneOptions(record_database=database, record_id=record_id, space_preset="full"), kernel)
    variants: dict[str, Any] = {}
    for config in ExhaustiveSamplingStrategy(space):
        if config.is_valid():
            variants.setdefault(config.code_key(), config)
    configs = list(variants.values())
    random.Random(seed).shuffle(configs)
    return configs


def repeated(configs: list, count: int) -> list:
    return (configs * -(-count // len(configs)))[:max(count, len(configs))]


def engine_settings(args: argparse.Namespace, kernel_us: float) -> dict[str, Any]:
    """The connection settings' engine part: the real one, or (test) the replayer on the fake engine."""
    if args.engine != "test":
        return {}
    env = {"MNEME_REPLAYER_ENGINE": json.dumps({"launch_ns": int(kernel_us * 1e3), "sleep": True})}
    return {"engine": f"{ENGINE_MODULE}:spec_from_env", "server_env": env}


def measure_row(args: argparse.Namespace) -> dict[str, Any]:
    """The child's work: one row's sweep on fresh local servers."""
    from mneme.model.experiment import ExperimentConfiguration
    from replay_server.client.connection import ConnectionSettings
    from replay_server.client.executor import AsyncReplayExecutor

    work = Path(args.work)
    os.environ["MNEME_CACHE_DIR"] = str(work / f"cache-{args.row}-{args.label}-{args.index}")  # cold caches
    small = args.row == "small"
    n = args.small_n if small else args.n
    database, record_id = args.databases[small], args.record_ids[small]
    if args.row == "launch" or small:
        configs, ahead = repeated(launch_space(n), args.configs), []
    elif args.row == "reference":
        configs = repeated(reference_space(n), args.configs)
        ahead = reference_space(n)[:5]
    else:
        configs, ahead = full_space_variants(database, record_id, args.index)[:args.configs], []
    server_args = ["--compile-processes", str(args.compile_processes)] if args.compile_processes else []
    if args.batch:
        server_args += ["--batch", str(args.batch)]
    connection = ConnectionSettings(local_gpus=[0], server_args=server_args,
                                    **engine_settings(args, args.test_small_kernel_us if small else args.test_kernel_us))
    started = time.perf_counter()
    executor = AsyncReplayExecutor(
        record_db=database, record_id=record_id, iterations=args.iterations, warmup=args.warmup,
        results_db_dir=str(work / f"results-{args.row}-{args.label}-{args.index}"), num_workers=args.workers,
        compile_ahead=ahead, connection=connection)
    try:
        baseline = executor.evaluate(ExperimentConfiguration.from_dict({"grid": {"x": -(-n // 256)},
                                                                        "block": {"x": 256}}))
        executor.wait_prepared(timeout=600)
        startup = time.perf_counter() - started
        if not baseline.verified:
            raise SystemExit(f"the baseline did not verify: {baseline.status}: {baseline.error}")
        servers = [s.process.pid for s in getattr(getattr(executor, "_local_servers", None), "servers", [])]
        cpu_servers, cpu_client = server_cpu(servers), client_cpu()
        start = time.perf_counter()
        results = [f.result() for f in [executor.submit(c) for c in configs]]
        seconds = time.perf_counter() - start
        cpu_client = client_cpu() - cpu_client
        after = server_cpu(servers)
    finally:
        executor.shutdown()
    verified = [r for r in results if r.verified]
    launches = args.iterations + args.warmup
    kernel_ns = statistics.median(t for r in verified for t in r.exec_time) if verified else 0.0
    executed = [r for r in results if r.executed]
    gpu_ns = sum(sum(r.exec_time) for r in executed)
    mean_ns = gpu_ns / sum(len(r.exec_time) for r in executed) if executed else 0.0
    compiled = [r.codegen_time for r in results if r.codegen_time > 0 and not r.compile_cached]
    replay = None
    if args.row == "launch" or small:
        if args.engine == "test":  # the replayer in this process on the fake engine, as the servers had it
            import importlib

            kernel_us = args.test_small_kernel_us if small else args.test_kernel_us
            importlib.import_module(ENGINE_MODULE).install(launch_ns=int(kernel_us * 1e3), sleep=True)
        replay = replay_floor(database, record_id, launch_space(n), args.iterations, args.warmup)
    return {
        "row": args.row, "label": args.label, "configs": len(configs), "verified": len(verified),
        "seconds": seconds, "rate": len(verified) / seconds, "kernel_us": kernel_ns / 1e3,
        "mean_us": mean_ns / 1e3, "floor": 1e9 / (launches * mean_ns) if mean_ns else 0.0,
        "busy": gpu_ns / 1e9 / seconds, "replay_floor": replay,
        "compile_processes": args.compile_processes or default_compile_processes(args.workers),
        "compile_ms": statistics.median(compiled) * 1e3 if compiled else None, "compiled": len(compiled),
        "startup": startup, "client_us": cpu_client / len(configs) * 1e6,
        **{f"{part}_us": (after[part] - cpu_servers[part]) / len(configs) * 1e6 for part in after},
        "failures": sorted({f"{r.status}: {r.error[:100]}" for r in results if not r.verified})[:5],
        "capacity": getattr(executor, "capacity", None),
    }


def replay_floor(database: str, record_id: str, space: list, iterations: int, warmup: int,
                 group: int = 8) -> float | None:
    """Configurations/s of ``space`` (one code variant) replayed back to back in this process, as a server's
    worker pipelines them but with no server: engine calls of ``group`` configurations
    (``Replayer.start_many``), each enqueued while the one before runs; what remains is each configuration's
    full reset, launches and comparisons on the GPU and the engine's enqueueing. Marginal: two more passes
    over ``space``, over the time they add (the best of three each)."""
    from mneme.recording.execution import RecordedExecution
    from mneme.replay.replayer import Replayer

    if not hasattr(Replayer, "start_many"):  # a compared tree without engine calls of several configurations
        return None
    with Replayer(RecordedExecution.from_json(database), record_id) as replayer:
        replayer.run(space[0], iterations, warmup)  # the code loaded, the reset policy settled

        def take(batch: Any) -> None:
            results = batch.results()
            if not all(r.verified for r in results):
                raise SystemExit(f"the replay floor's configurations did not verify: {results[0].error}")

        def sweep(passes: int) -> float:
            configs = space * passes
            started = time.perf_counter()
            pending = None
            for at in range(0, len(configs), group):
                batch = replayer.start_many([(c, iterations, warmup, None) for c in configs[at:at + group]])
                if pending is not None:
                    take(pending)
                pending = batch
            take(pending)
            return time.perf_counter() - started

        sweep(1)
        one = min(sweep(1) for _ in range(3))
        three = min(sweep(3) for _ in range(3))
    return 2 * len(space) / (three - one) if three > one else 0.0


def default_compile_processes(workers: int) -> int:
    """The local server's compile pool (a compared tree without the function had ``min(4, CPUs)``)."""
    try:
        from replay_server.server.serve import default_compile_processes as servers_default
    except ImportError:
        return min(4, os.cpu_count() or 1)
    return servers_default(workers)


def measure_tune(args: argparse.Namespace) -> dict[str, Any]:
    """``mneme tune`` of the full preset, random sampler, end to end: trials/s from first to last trial."""
    import datetime

    from mneme._internal.child_process import child_env, mneme_command

    work = Path(args.work)
    results = work / f"tune-{args.label}-{args.index}"
    shutil.rmtree(results, ignore_errors=True)
    engine = engine_settings(args, args.test_kernel_us)
    env = child_env({"MNEME_CACHE_DIR": str(work / f"cache-tune-{args.label}-{args.index}"),
                     **engine.get("server_env", {})})
    command = mneme_command("tune", "-rdb", args.databases[0], "-rid", args.record_ids[0], "--space-preset", "full",
                            "--sampler", "random", "--trials", str(args.configs), "--seed", str(args.index),
                            "--workers", str(args.workers), "--results-dir", str(results), "--quiet",
                            *(["--server-engine", engine["engine"]] if engine else []))
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=work, timeout=3600)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"mneme tune exited {done.returncode}: {done.stderr[-2000:]}")
    records = [json.loads(line) for line in (results / "trials.jsonl").read_text().splitlines()]
    stamps = sorted(datetime.datetime.fromisoformat(r["timestamp"]).timestamp() for r in records)
    verified = sum(1 for r in records if r.get("verified"))
    seconds = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
    return {"row": "tune", "label": args.label, "configs": len(records), "verified": verified, "seconds": seconds,
            "rate": (len(records) - 1) / seconds if seconds else 0.0, "end_to_end_s": wall}


# -- the parent: rows, trees, the table ---------------------------------------------------------------------
def child(args: argparse.Namespace, row: str, label: str, tree: str | None, index: int, work: Path,
          recordings: list) -> dict[str, Any]:
    env = dict(os.environ)
    paths = [str(work / "engine")] if args.engine == "test" else []
    if tree is not None:
        paths.insert(0, tree)
    if paths:
        env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    command = [sys.executable, str(HERE), "--child", row, "--label", label, "--index", str(index), "--work",
               str(work), "--engine", args.engine, "--n", str(args.n), "--small-n", str(args.small_n),
               "--configs", str(args.configs), "--workers", str(args.workers), "--iterations", str(args.iterations),
               "--warmup", str(args.warmup), "--compile-processes", str(args.compile_processes), "--batch", str(args.batch),
               "--test-kernel-us", str(args.test_kernel_us), "--test-small-kernel-us", str(args.test_small_kernel_us),
               "--recordings", json.dumps(recordings)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"row": row, "label": label, "error": (done.stderr or done.stdout)[-1500:]}
    return json.loads(lines[-1])


def _median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(args: argparse.Namespace, rows: list[dict], labels: list[str]) -> str:
    """The markdown table: one line per row and tree (medians of the runs), the targets after it."""
    lines = [f"vector add, n={args.n} (small: n={args.small_n}); {args.iterations} iterations + {args.warmup} "
             f"warm-ups per configuration; one GPU, {args.workers} worker(s); engine "
             f"{'test (no GPU: host work only)' if args.engine == 'test' else 'cuda'}; medians of "
             f"{args.repeats} run(s) each\n",
             "| row | tree | configs | verified | s | configs/s | kernel us | mean us | floor/s | GPU busy "
             "| replay floor/s | % of replay floor | compile ms | client us/cfg | supervisor us/cfg | workers us/cfg "
             "| compile us/cfg |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    by: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        by.setdefault((r["row"], r["label"]), []).append(r)
    notes = []
    for row in [r for r in ROWS if any(k[0] == r for k in by)]:
        for label in labels:
            runs = [r for r in by.get((row, label), []) if "error" not in r]
            for failed in by.get((row, label), []):
                if "error" in failed:
                    notes.append(f"* {row}, {label}: failed: {failed['error'].strip().splitlines()[-1][:300]}")
            if not runs:
                continue
            rate, floor, replay = _median(runs, "rate"), _median(runs, "floor"), _median(runs, "replay_floor")
            lines.append(
                f"| {row} | {label} | {runs[0]['configs']} | {sum(r['verified'] for r in runs)}/"
                f"{sum(r['configs'] for r in runs)} | {_cell(_median(runs, 'seconds'), '.2f')} | {rate:.0f} | "
                f"{_cell(_median(runs, 'kernel_us'), '.1f')} | {_cell(_median(runs, 'mean_us'), '.1f')} | "
                f"{_cell(floor, '.0f')} | {_cell(_median(runs, 'busy'), '.0%')} | {_cell(replay, '.0f')} | "
                f"{_cell(rate / replay if replay else None, '.0%')} | {_cell(_median(runs, 'compile_ms'), '.1f')} | "
                f"{_cell(_median(runs, 'client_us'), '.0f')} | {_cell(_median(runs, 'supervisor_us'), '.0f')} | "
                f"{_cell(_median(runs, 'workers_us'), '.0f')} | {_cell(_median(runs, 'compile_us'), '.0f')} |")
            for r in runs:
                notes += [f"* {row}, {label}: not verified: {f}" for f in r.get("failures", [])]
    lines.append("")
    for label in labels:
        def med(row: str, key: str, label: str = label) -> float | None:
            return _median([r for r in by.get((row, label), []) if "error" not in r], key)

        verdicts = []
        busy = med("launch", "busy")
        if busy is not None:
            replay, rate = med("launch", "replay_floor"), med("launch", "rate")
            verdicts.append(f"launch {busy:.0%} GPU busy (target >= {BUSY_TARGET:.0%}: "
                            f"{'met' if busy >= BUSY_TARGET else 'NOT met'}"
                            + (f"; {rate / replay:.0%} of the replay floor, which is {replay:.0f}/s: "
                               f"{replay * (args.iterations + args.warmup) * med('launch', 'mean_us') / 1e6:.0%} "
                               "GPU busy" if replay else "") + ")")
        small_rate, small_floor = med("small", "rate"), med("small", "floor")
        if small_rate and small_floor:
            verdicts.append(f"small {small_rate:.0f}/s against a floor of {small_floor:.0f}/s "
                            f"(gap {1 - small_rate / small_floor:.0%})")
        compile_rate = med("compile", "rate")
        if compile_rate is not None:
            compile_floor, compile_ms = med("compile", "floor"), med("compile", "compile_ms")
            processes = med("compile", "compile_processes")
            verdicts.append(
                f"compile {compile_rate:.0f}/s (target >= {COMPILE_TARGET:.0f} on 16 cores: "
                f"{'met' if compile_rate >= COMPILE_TARGET else 'NOT met'}; {os.cpu_count()} CPUs here; "
                f"{med('compile', 'busy'):.0%} GPU busy: its kernels alone allow {compile_floor:.0f}/s"
                + (f"; the compile pool, {processes:.0f} processes of {compile_ms:.1f} ms a variant, "
                   f"{processes * 1e3 / compile_ms:.0f}/s" if compile_ms and processes else "") + ")")
        tune_rate = med("tune", "rate")
        if tune_rate is not None and compile_rate:
            ratio = tune_rate / compile_rate
            verdicts.append(f"mneme tune {tune_rate:.0f} trials/s, {ratio:.0%} of the compile row (target >= "
                            f"{TUNE_TARGET:.0%}: {'met' if ratio >= TUNE_TARGET else 'NOT met'})")
        if verdicts:
            lines.append(f"* {label}: " + "; ".join(verdicts))
    return "\n".join(lines + notes) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default=",".join(ROWS), help=f"rows to run (default {','.join(ROWS)})")
    p.add_argument("--configs", type=int, default=1000, help="configurations per sweep at least (default 1000)")
    p.add_argument("--n", type=int, default=REFERENCE_N, help="the vector add's length (default: the reference's)")
    p.add_argument("--small-n", type=int, default=SMALL_N, help=f"the small row's length (default {SMALL_N}: ~5 us)")
    p.add_argument("--workers", type=int, default=1, help="worker processes on the GPU (default 1)")
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1, help="runs of each row and tree, interleaved (default 1)")
    p.add_argument("--compile-processes", type=int, default=0, help="the servers' compile pool (default: theirs)")
    p.add_argument("--batch", type=int, default=0, help="the servers' --batch (default: theirs)")
    p.add_argument("--compare-tree", metavar="DIR", help="another mneme (an importable tree) run beside this one")
    p.add_argument("--compare-label", default="compared", help="the compared tree's name in the table (a commit)")
    p.add_argument("--engine", choices=("cuda", "test"), default="cuda")
    p.add_argument("--test-kernel-us", type=float, default=47.9, help="--engine test: the kernel's time")
    p.add_argument("--test-small-kernel-us", type=float, default=5.0, help="--engine test: the small kernel's time")
    p.add_argument("--results-file", default=str(REPO / "bench" / "results" / "sweep_pace.md"))
    p.add_argument("--no-results-file", action="store_true")
    p.add_argument("--child", choices=ROWS, help=argparse.SUPPRESS)
    p.add_argument("--label", default="this tree", help=argparse.SUPPRESS)
    p.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--recordings", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        recordings = json.loads(args.recordings)
        args.row = args.child
        args.databases, args.record_ids = [r[0] for r in recordings], [r[1] for r in recordings]
        print(json.dumps(measure_tune(args) if args.row == "tune" else measure_row(args)), flush=True)
        return 0
    rows_wanted = [r for r in args.rows.split(",") if r]
    if not set(rows_wanted) <= set(ROWS):
        p.error(f"--rows: each one of {', '.join(ROWS)}")
    if args.compare_tree and not (Path(args.compare_tree) / "mneme" / "__init__.py").is_file():
        p.error(f"--compare-tree {args.compare_tree}: no importable mneme there")
    if args.engine == "cuda":
        from mneme._internal.devices import visible_gpu_count

        if visible_gpu_count() < 1:
            print("no GPU visible: run with --engine test for the host's work alone")
            return 1
    from mneme.testing.synthetic import write_vecadd_recording

    trees = [("this tree", None)] + ([(args.compare_label, str(Path(args.compare_tree).resolve()))]
                                     if args.compare_tree else [])
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="mneme-pace-") as tmp:
        work = Path(tmp)
        if args.engine == "test":
            (work / "engine").mkdir()
            shutil.copy(REPO / "replay_server" / "testing" / "replayer_engine.py", work / "engine" / f"{ENGINE_MODULE}.py")
        recordings = []
        for name, n in (("rec", args.n), ("rec-small", args.small_n)):
            recording = write_vecadd_recording(str(work / name), n=n, block=256)
            recordings.append((recording.path, recording.dynamic_hash))
        for index in range(args.repeats):
            for row in rows_wanted:
                for label, tree in trees:
                    print(f"[sweep_pace] run {index}: {row}, {label}", file=sys.stderr, flush=True)
                    rows.append(child(args, row, label, tree, index, work, recordings))
    text = table(args, rows, [label for label, _ in trees])
    print(text)
    if not args.no_results_file:
        from results_file import write_section

        title = f"{'test engine (no GPU)' if args.engine == 'test' else 'one GPU'}, {args.workers} worker(s)"
        write_section(args.results_file, title, text, heading="Sweeps at the GPU's pace (bench/sweep_pace.py)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
