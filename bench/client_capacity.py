"""Client capacity: results per second one tuning process takes from 1, 2, 4, 8 and 16 replay servers.

The servers run the test engine (``tests/server/fake_engine.py``: a replay costs ``--replay-us`` of
sleep, no GPU), on loopback, so the servers answer as fast as a client asks and the client is what
is measured. Two levels, each over the same servers:

* ``executor``: ``AsyncReplayExecutor`` alone (submit, gRPC stream, result, ``results.jsonl``), kept
  full (as many configurations outstanding as the servers hold);
* ``tuner``: the whole ``mneme tune`` loop in this process (exhaustive sampling of a launch-shape
  space, scoring, ``trials.jsonl``, the executor as above).

Rates are taken over the steady part (after ``--settle`` seconds); "client CPU" is this process's CPU
time over that wall time (100% = one core), and "us/result" the client CPU per result.

``--mode shared-study``: tuner processes (``--tuners``, default 1 then 2) share one Optuna study
(``journal:`` file by default, ``--storage`` for another) and the same servers; their trial rate
together against one process's, where the servers are not saturated.

    python bench/client_capacity.py                         # the curve, executor and tuner levels
    python bench/client_capacity.py --servers 16 --seconds 5
    python bench/client_capacity.py --mode shared-study --servers 8

Targets: >= 10,000 results/s from 16 servers in one process; >= 1.8x one process's trial rate with
two processes sharing a study.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAKE = REPO / "tests" / "server"
sys.path.append(str(REPO))

from mneme.async_executor import AsyncReplayExecutor, server_capacity  # noqa: E402
from mneme.format.synthetic import write_vecadd_recording  # noqa: E402
from mneme.mneme_types import ExperimentConfiguration  # noqa: E402

TARGET_RESULTS = 10_000
TARGET_SHARED = 1.8
SPACE = '''
from mneme.mneme_types import ExperimentConfiguration
from mneme.tuning.search_space import IntRangeParam, SearchSpace


class LaunchGrid(SearchSpace):
    """Launch shapes only (no code variants, so no compiles): 1024 block sizes x 64 grid sizes."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.dims = {"block_dim_x": IntRangeParam("block_dim_x", 1, 1024),
                     "grid_dim_x": IntRangeParam("grid_dim_x", 1, 64)}

    def dimensions(self):
        return self.dims

    def derived(self, params):
        return ExperimentConfiguration.from_dict({"grid": {"x": params["grid_dim_x"]},
                                                  "block": {"x": params["block_dim_x"]}})

    def baseline(self):
        return ExperimentConfiguration.from_dict({"grid": {"x": self.kernel.grid_dim.x},
                                                  "block": {"x": self.kernel.block_dim.x}})
'''


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Servers:
    """``count`` ``mneme serve`` processes with the test engine on loopback."""

    def __init__(self, count: int, store: Path, workers: int, replay_us: float, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(FAKE), os.environ.get("PYTHONPATH", "")]),
               "MNEME_FAKE_ENGINE": json.dumps({"log_dir": str(log_dir), "replay_seconds": replay_us / 1e6,
                                                "with_compiler": False})}
        self.processes = [subprocess.Popen(
            [sys.executable, "-m", "replay_server", "--gpu", "0", "--port", "0", "--host", "127.0.0.1",
             "--store", str(store), "--workers", str(workers), "--log-level", "WARNING", "--compile-processes", "-1",
             "--engine", "fake_engine:spec_from_env"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env) for _ in range(count)]
        self.addresses = []
        for process in self.processes:
            line = process.stdout.readline()
            if "listening on" not in line:
                self.stop()
                raise SystemExit(f"a test-engine server did not start: {line!r}")
            self.addresses.append(line.split("listening on ", 1)[1].split()[0])

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()


def executor_rate(db: str, rid: str, servers: list[str], workers: int, seconds: float, settle: float,
                  results_dir: Path) -> dict:
    """Keep the executor full for ``settle + seconds``; the rate over the last ``seconds``."""
    window = server_capacity(workers) * len(servers)
    free = threading.Semaphore(window)
    done = [0]

    def finished(_future) -> None:
        done[0] += 1
        free.release()

    configs = [ExperimentConfiguration.from_dict({"grid": {"x": 1 + i % 64}, "block": {"x": 1 + i % 1024}})
               for i in range(4096)]
    with AsyncReplayExecutor(db, rid, iterations=1, warmup=0, servers=servers,
                             results_db_dir=str(results_dir)) as executor:
        executor.wait_prepared(timeout=120)
        start = time.monotonic()
        mark = None
        i = 0
        while True:
            now = time.monotonic()
            if mark is None and now - start >= settle:
                mark = (now, done[0], cpu_seconds())
            if now - start >= settle + seconds:
                break
            free.acquire()
            executor.submit(configs[i % len(configs)]).add_done_callback(finished)
            i += 1
        end = (time.monotonic(), done[0], cpu_seconds())
    wall = end[0] - mark[0]
    results = end[1] - mark[1]
    return {"results": results, "rate": results / wall, "cpu": (end[2] - mark[2]) / wall,
            "us_per_result": 1e6 * (end[2] - mark[2]) / max(results, 1)}


def trial_times(directory: Path) -> list[float]:
    return [datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp()
            for line in (directory / "trials.jsonl").read_text().splitlines()]


def tuner_rate(db: str, rid: str, servers: list[str], workers: int, seconds: float, settle: float,
               work: Path) -> dict:
    """The ``mneme tune`` loop in this process for ``settle + seconds``; trials/s over the last part."""
    from tuner.options import resolve_options
    from tuner.run import run_tune

    space = work / "launch_grid.py"
    space.write_text(SPACE)
    results = work / f"tune-{len(servers)}"
    options = resolve_options({
        "record_database": db, "record_id": rid, "servers": servers, "space_module": f"{space}:LaunchGrid",
        "results_dir": str(results), "timeout": settle + seconds, "quiet": True, "iterations": 1, "warmup": 0,
        "workers": max(1, server_capacity(workers) * len(servers) // 2),  # in flight: 2 x workers
        "tolerance": "exact", "proteus_output": False,
    })
    cpu0 = cpu_seconds()
    run_tune(options, out=io.StringIO(), is_tty=False)
    cpu = cpu_seconds() - cpu0
    times = trial_times(results)
    start = times[0] + settle
    steady = [t for t in times if t >= start]
    wall = (steady[-1] - steady[0]) if len(steady) > 1 else float("nan")
    total_wall = times[-1] - times[0]
    return {"results": len(steady), "rate": (len(steady) - 1) / wall, "cpu": cpu / total_wall,
            "us_per_result": 1e6 * cpu / max(len(times), 1)}


def print_curve(rows: list[tuple[str, int, dict]]) -> None:
    print("| level | servers | results/s | results timed | client CPU | client CPU per result |")
    print("|---|---|---|---|---|---|")
    for level, n, r in rows:
        print(f"| {level} | {n} | {r['rate']:.0f} | {r['results']} | {100 * r['cpu']:.0f}% | {r['us_per_result']:.0f} us |")
    best = {level: r["rate"] for level, n, r in rows if n == max(m for _, m, _ in rows)}
    for level, rate in best.items():
        verdict = "met" if rate >= TARGET_RESULTS else "not met"
        print(f"target >= {TARGET_RESULTS}/s at {max(m for _, m, _ in rows)} servers, {level}: {rate:.0f}/s ({verdict})")


# -- shared studies ----------------------------------------------------------------------------------
def tuner_process(settings: dict) -> int:
    """One tuner of ``--mode shared-study`` (run as a child process)."""
    from tuner.options import resolve_options
    from tuner.run import run_tune

    return run_tune(resolve_options(settings), out=io.StringIO(), is_tty=False)


def shared_study(db: str, rid: str, servers: list[str], workers: int, trials: int, tuners: list[int],
                 storage: str | None, work: Path) -> list[dict]:
    space = work / "launch_grid.py"
    space.write_text(SPACE)
    rows = []
    for count in tuners:
        study = storage or f"journal:{work / f'study-{count}.log'}"
        dirs = [work / f"shared-{count}-{i}" for i in range(count)]
        per = max(1, server_capacity(workers) * len(servers) // (2 * count))
        procs = []
        for d in dirs:
            settings = {"record_database": db, "record_id": rid, "servers": servers, "space_module": f"{space}:LaunchGrid",
                        "results_dir": str(d), "quiet": True, "iterations": 1, "warmup": 0, "workers": per,
                        "sampler": "random", "trials": trials, "seed": len(procs), "optuna_storage": study,
                        "study_name": f"capacity-{count}", "tolerance": "exact", "proteus_output": False}
            procs.append(subprocess.Popen([sys.executable, __file__, "--tuner-process", json.dumps(settings)]))
        for p in procs:
            p.wait()
        times = sorted(t for d in dirs for t in trial_times(d))
        # Steady part: from the moment every process has started trials to the first that finished.
        first = max(trial_times(d)[0] for d in dirs)
        last = min(trial_times(d)[-1] for d in dirs)
        steady = [t for t in times if first <= t <= last]
        rows.append({"tuners": count, "trials": len(times), "rate": (len(steady) - 1) / max(last - first, 1e-9),
                     "per_process": [len(trial_times(d)) for d in dirs]})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("curve", "shared-study", "all"), default="curve")
    p.add_argument("--servers", default="1,2,4,8,16", help="server counts of the curve (default 1,2,4,8,16)")
    p.add_argument("--levels", default="executor,tuner", help="executor, tuner or both (default both)")
    p.add_argument("--workers", type=int, default=2, help="worker processes per server (default 2)")
    p.add_argument("--replay-us", type=float, default=0.0, help="what one replay costs a server (sleep, us)")
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per point (default 3)")
    p.add_argument("--settle", type=float, default=1.0, help="seconds before timing starts (default 1)")
    p.add_argument("--trials", type=int, default=3000, help="--mode shared-study: trials per tuner process")
    p.add_argument("--tuners", default="1,2", help="--mode shared-study: tuner processes to compare")
    p.add_argument("--storage", default=None, help="--mode shared-study: Optuna storage (default a journal file)")
    p.add_argument("--tuner-process", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tuner_process:
        return tuner_process(json.loads(args.tuner_process))
    counts = [int(n) for n in args.servers.split(",")]
    with tempfile.TemporaryDirectory(prefix="mneme-capacity-") as tmp:
        work = Path(tmp)
        recording = write_vecadd_recording(work / "store", n=40000 * 256 // 1000, block=256)
        db, rid = str(work / "store" / recording.database), recording.dynamic_hash
        servers = Servers(max(counts), work / "store", args.workers, args.replay_us, work / "log")
        print(f"{max(counts)} test-engine servers, {args.workers} workers each, replay {args.replay_us:g} us; "
              f"client: one process, {os.cpu_count()} CPUs on the machine")
        try:
            if args.mode in ("curve", "all"):
                rows = []
                for n in counts:
                    for level in args.levels.split(","):
                        measure = executor_rate if level == "executor" else tuner_rate
                        target = work / f"{level}-{n}"
                        target.mkdir()
                        rows.append((level, n, measure(db, rid, servers.addresses[:n], args.workers, args.seconds,
                                                       args.settle, target)))
                        r = rows[-1][2]
                        print(f"  {level} x{n}: {r['rate']:.0f}/s", flush=True)
                print_curve(rows)
            if args.mode in ("shared-study", "all"):
                n = max(counts)
                rows = shared_study(db, rid, servers.addresses[:n], args.workers, args.trials,
                                    [int(t) for t in args.tuners.split(",")], args.storage, work)
                print(f"\nshared study ({args.storage or 'journal file'}), {n} servers, {args.trials} trials per process:")
                print("| tuner processes | trials/s together | trials (per process) |")
                print("|---|---|---|")
                for r in rows:
                    print(f"| {r['tuners']} | {r['rate']:.0f} | {r['trials']} ({', '.join(map(str, r['per_process']))}) |")
                if len(rows) > 1:
                    ratio = rows[-1]["rate"] / rows[0]["rate"]
                    verdict = "met" if ratio >= TARGET_SHARED else "not met"
                    print(f"{rows[-1]['tuners']} processes / {rows[0]['tuners']}: {ratio:.2f}x "
                          f"(target >= {TARGET_SHARED}x: {verdict})")
        finally:
            servers.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
