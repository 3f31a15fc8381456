"""Start-up latency of `mneme tune`: time to the first verified result and to the end, and where it goes.

    python bench/tune_startup.py [--repeats 3] [--work DIR] [--spaces launch reference]

Builds and records the README's vector add (``make -C examples/vecadd``,
``mneme record``), then runs ``mneme tune`` on it as a user would (the
``mneme`` entry point, a fresh results directory each run) with the 13-point
launch preset of the README walkthrough and with the reference's 80-point
space (examples/tuning_vecadd_exhaustive.py), ``--repeats`` times each. Every
process of a run writes start-up trace points (``MNEME_STARTUP_TRACE``,
mneme/startup_trace.py); the table splits the time to the first result into
its phases along the critical path: the command's interpreter and imports,
reading the recording and building the space, the local server's start, its
worker's start, CUDA context, window reservation and self-test, restoring the
instance (snapshots, device state), the instance's one-time proof
(``get_ready``), the baseline, the first trial; compiles run beside them in
the compile processes (their total is listed). The first run of each space
starts with an empty compile cache (``MNEME_CACHE_DIR`` of this benchmark);
the table shows it and the median of the others.

Targets (issue #20, one H100, the launch preset): first verified result
<= 1.0 s, end to end <= 1.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # a source checkout is the fallback: an installed mneme (with its native parts) wins

from mneme import startup_trace  # noqa: E402
from mneme.child_process import child_env, mneme_command  # noqa: E402

TARGET_FIRST_S, TARGET_END_S = 1.0, 1.5
SPACES = {
    "launch": ["--space-preset", "launch", "--launch-dim", "x", "--sampler", "exhaustive"],
    "reference": ["--space-module", f"{REPO / 'examples' / 'tuning_vecadd_exhaustive.py'}:EntireSpace",
                  "--sampler", "exhaustive"],
}
# (label, start point, end point): consecutive phases of the critical path to the first trial's result.
PHASES = [
    ("interpreter + imports", "launch", "cli.start"),
    ("argument parsing", "cli.start", "cli.parsed"),
    ("recording + space", "cli.parsed", "tune.space"),
    ("server: interpreter + imports", "executor.spawn", "server.cli.start"),
    ("server: up, workers spawned", "server.cli.start", "server.workers_spawned"),
    ("worker: interpreter + imports", "server.workers_spawned", "worker.start"),
    ("worker: CUDA context", "worker.start", "engine.context"),
    ("worker: self-test", "engine.context", "worker.self_test"),
    ("restore: imports, recording database", "worker.self_test", "worker.recording"),
    ("restore: replayer, context", "worker.recording", "replayer.context"),
    ("restore: snapshot headers", "replayer.context", "replayer.snapshots"),
    ("restore: device state", "replayer.snapshots", "replayer.restored"),
    ("prepare: get_ready (proof)", "worker.restored", "worker.prepared"),
    ("baseline result", "worker.prepared", "executor.result1"),
    ("first trial result", "executor.result1", "executor.result2"),
]


@dataclass
class Run:
    space: str
    index: int
    points: dict[str, float] = field(default_factory=dict)  # name -> seconds since launch
    compile_s: float = 0.0
    compiles: int = 0
    end_s: float = 0.0
    trials: int = 0
    verified: int = 0

    def at(self, name: str) -> float | None:
        return self.points.get(name)

    def phase(self, start: str, end: str) -> float | None:
        a, b = self.at(start), self.at(end)
        return None if a is None or b is None else b - a

    @property
    def first_s(self) -> float | None:
        return self.at("executor.result2")


def mneme_cli() -> list[str]:
    """How a user starts mneme: the entry point when it runs this interpreter, else the same with -P."""
    found = shutil.which("mneme")
    if found:
        with open(found, "rb") as f:
            first = f.readline().decode(errors="replace")
        if first.startswith("#!") and os.path.realpath(first[2:].split()[0]) == os.path.realpath(sys.executable):
            return [found]
    return mneme_command()


def prepare_recording(work: Path) -> str:
    make = subprocess.run(["make", "-C", str(REPO / "examples" / "vecadd")], capture_output=True, text=True)
    if make.returncode != 0:
        raise SystemExit(f"make -C examples/vecadd failed:\n{make.stdout[-2000:]}{make.stderr[-2000:]}")
    recordings = work / "recordings" / "vecadd"
    shutil.rmtree(recordings, ignore_errors=True)
    done = subprocess.run([*mneme_cli(), "record", "-rdb", str(recordings), "--",
                           str(REPO / "examples" / "vecadd" / "vecadd")], capture_output=True, text=True,
                          env=child_env())
    databases = sorted(recordings.glob("*.json"))
    if done.returncode != 0 or len(databases) != 1:
        raise SystemExit(f"mneme record failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return str(databases[0])


def one_run(space: str, index: int, database: str, work: Path) -> Run:
    results = work / "results" / f"{space}-{index}"
    shutil.rmtree(results, ignore_errors=True)
    trace = work / "traces" / f"{space}-{index}.jsonl"
    trace.parent.mkdir(parents=True, exist_ok=True)
    trace.unlink(missing_ok=True)
    env = child_env({startup_trace.ENV: str(trace), "MNEME_CACHE_DIR": str(work / "cache")})
    command = [*mneme_cli(), "tune", "-rdb", database, *SPACES[space], "--results-dir", str(results), "--quiet"]
    launched = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=work, timeout=600)
    ended = time.time()
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    run = runs_points(Run(space, index, end_s=ended - launched), startup_trace.read(trace), launched)
    summary = json.loads((results / "summary.json").read_text())
    run.trials, run.verified = summary["trials"], summary["verified"]
    return run


def runs_points(run: Run, points: list[dict], launched: float) -> Run:
    """Name the trace points of one run (seconds since its launch); the first of each name counts."""
    server_pids = {p["pid"] for p in points if p["role"] == "server"}
    for p in points:
        name = f"{p['role']}.{p['point']}"
        if p["role"] == "cli" and p["pid"] in server_pids:
            name = f"server.{name}"
        if p["point"] == "result":
            name += str(p["index"])
        if p["role"] == "compile":
            run.compile_s += p.get("seconds", 0.0)
            run.compiles += 1
            continue
        run.points.setdefault(name, p["t"] - launched)  # the first of each (the first worker, the first server)
    run.points["launch"] = 0.0
    return run


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def median(values: list[float | None]) -> float | None:
    have = [v for v in values if v is not None]
    return statistics.median(have) if have else None


def table(runs: list[Run]) -> str:
    spaces = list(dict.fromkeys(r.space for r in runs))
    columns: list[tuple[str, list[Run]]] = []
    for space in spaces:
        mine = [r for r in runs if r.space == space]
        columns.append((f"{space}: cold", mine[:1]))
        if len(mine) > 1:
            columns.append((f"{space}: median of {len(mine) - 1}", mine[1:]))
    header = "| phase (s) | " + " | ".join(label for label, _ in columns) + " |"
    lines = [header, "|" + " --- |" * (len(columns) + 1)]

    def row(label: str, value) -> None:
        lines.append(f"| {label} | " + " | ".join(fmt(median([value(r) for r in group])) for _, group in columns) + " |")

    for label, start, end in PHASES:
        row(label, lambda r, s=start, e=end: r.phase(s, e))
    row("**first verified result**", lambda r: r.first_s)
    row("rest of the sweep", lambda r: r.phase("executor.result2", "tune.shutdown"))
    row("executor shutdown (servers told to stop)", lambda r: r.phase("tune.shutdown", "tune.stopped"))
    row("results written, exit", lambda r: None if r.at("tune.stopped") is None else r.end_s - r.at("tune.stopped"))
    row("**end to end**", lambda r: r.end_s)
    row("compiles (in compile processes, total)", lambda r: r.compile_s)
    lines.append("| configurations (verified/trials) | " + " | ".join(
        f"{group[0].verified}/{group[0].trials}" for _, group in columns) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per space (the first has a cold compile cache)")
    parser.add_argument("--spaces", nargs="+", choices=list(SPACES), default=list(SPACES))
    parser.add_argument("--work", help="working directory (default: a temporary one, removed)")
    parser.add_argument("--json", help="also write every run's points here")
    args = parser.parse_args(argv)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="mneme-tune-startup-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        database = prepare_recording(work)
        runs = [one_run(space, i, database, work) for space in args.spaces for i in range(args.repeats)]
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip().splitlines()
    print(f"mneme tune start-up on {gpu[0] if gpu else 'an unknown GPU'}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{args.repeats} run(s) per space")
    print(table(runs))
    launch = [r for r in runs if r.space == "launch"]
    if launch:
        first, end = median([r.first_s for r in launch]), median([r.end_s for r in launch])
        print(f"launch preset, median of {len(launch)}: first verified result {fmt(first)} s "
              f"(target {TARGET_FIRST_S} s: {'met' if first is not None and first <= TARGET_FIRST_S else 'NOT met'}), "
              f"end to end {fmt(end)} s (target {TARGET_END_S} s: {'met' if end <= TARGET_END_S else 'NOT met'})")
    if args.json:
        Path(args.json).write_text(json.dumps([vars(r) for r in runs], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
