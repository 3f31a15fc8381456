"""Start-up latency of `mneme tune`: time to the first verified result and to the end, and where it goes.

    python bench/tune_startup.py [--repeats 3] [--work DIR] [--spaces launch reference]
                                 [--setups fresh reused] [--engine cuda|test] [--compare-tree DIR]

Builds and records the README's vector add (``make -C examples/vecadd``,
``mneme record``), then runs ``mneme tune`` on it as a user would (the
``mneme`` entry point, a fresh results directory each run) with the 13-point
launch preset of the README walkthrough and with the reference's 80-point
space (examples/tuning_vecadd_exhaustive.py), ``--repeats`` times each. Every
process of a run writes start-up trace points (``MNEME_STARTUP_TRACE``,
mneme/_internal/startup_trace.py); the table splits the time to the first result into
its phases along the critical path: the command's interpreter and imports,
reading the recording and building the space, the local server's start, its
worker's start, CUDA context, window reservation and self-test, restoring the
instance (snapshots, device state), the instance's one-time proof
(``get_ready``), the baseline, the first trial; compiles run beside them in
the compile processes (their total is listed). The first run of each space
starts with an empty compile cache (``MNEME_CACHE_DIR`` of this benchmark);
the table shows it and the median of the others.

Setups, interleaved run by run (``--setups``): ``fresh``, the default
``mneme tune`` that starts its local server and stops it; ``reused``, a
``mneme tune`` that finds a local server left running (``mneme serve
--local``, started by this benchmark with its own cache directory, after one
run that is not counted: the server has restored the instance, as for a
user's second run; replay_server/kept_servers.py). ``--compare-tree DIR`` adds
``fresh`` runs of another source tree of mneme (e.g. ``git archive REV | tar
-x -C DIR``) beside them: a before/after of a change. The summary gives each
setup's median and range and its ratio to ``fresh`` (of the medians, and the
range of the run-by-run ratios).

``--engine test`` runs it all without a GPU: a synthetic vector-add recording
(mneme.testing.synthetic) and local servers running the test engine
(replay_server/testing/fake_engine.py: a replay costs ``--replay-us`` of sleep, a
compile ``--compile-ms``; no CUDA context, no restore), so what is measured
is mneme's own part of the start-up: processes, imports, gRPC, the tuner.

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

from mneme._internal import startup_trace  # noqa: E402
from mneme._internal.child_process import child_env, mneme_command  # noqa: E402

TARGET_FIRST_S, TARGET_END_S = 1.0, 1.5
TEST_ENGINE = "replay_server.testing.fake_engine:spec_from_env"
KEPT_SERVER_KEEP_ALIVE_S = 600
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
# A run that found a local server left running has none of the server's and worker's points.
REUSED_PHASES = [
    ("kept server found and probed", "cli.parsed", "executor.reused"),
    ("connected, after recording + space", "executor.reused", "executor.connected"),
    ("baseline result (instance prepared)", "executor.connected", "executor.result1"),
]


@dataclass(frozen=True)
class Setting:
    """How the runs are made: the engine, the cost of a test-engine replay and compile, the mneme trees."""

    engine: str  # "cuda" or "test"
    replay_us: float = 100.0
    compile_ms: float = 10.0
    compare_tree: str | None = None

    def env(self, work: Path, cache: str, trace: Path | None, tree: str | None = None) -> dict[str, str]:
        """The environment of a run (or of the kept server: no trace): this tree's mneme (or ``tree``'s)."""
        extra = {"MNEME_CACHE_DIR": str(work / cache)}
        if trace is not None:
            extra[startup_trace.ENV] = str(trace)
        paths = []
        if self.engine == "test":
            extra["MNEME_FAKE_ENGINE"] = json.dumps({"log_dir": str(work / "engine-log"),
                                                     "replay_seconds": self.replay_us / 1e6,
                                                     "compile_seconds": self.compile_ms / 1e3})
            (work / "engine-log").mkdir(exist_ok=True)
            paths.append(str(Path(tree or REPO) / "tests" / "server"))
        if tree is None:
            env = child_env(extra)
            env["PYTHONPATH"] = os.pathsep.join([*filter(None, env.get("PYTHONPATH", "").split(os.pathsep)), *paths])
            return env
        env = {k: v for k, v in os.environ.items() if k != startup_trace.ENV}
        rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        return {**env, **extra, "PYTHONPATH": os.pathsep.join([tree, *paths, *rest])}

    def engine_args(self) -> list[str]:
        return ["--server-engine", TEST_ENGINE] if self.engine == "test" else []


@dataclass
class Run:
    space: str
    index: int
    setup: str = "fresh"
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


def prepare_recording(work: Path, setting: Setting) -> str:
    if setting.engine == "test":  # the README's vector add's shape: 13 launch-preset points
        from mneme.testing.synthetic import write_vecadd_recording

        recordings = work / "recordings" / "vecadd"
        shutil.rmtree(recordings, ignore_errors=True)
        return str(recordings / write_vecadd_recording(recordings, n=1 << 20, block=256).database)
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


def one_run(space: str, index: int, database: str, work: Path, setting: Setting, setup: str = "fresh") -> Run:
    """One ``mneme tune``; its servers have exited when this returns (the next run starts on a quiet machine)."""
    results = work / "results" / f"{space}-{setup}-{index}"
    shutil.rmtree(results, ignore_errors=True)
    trace = work / "traces" / f"{space}-{setup}-{index}.jsonl"
    trace.parent.mkdir(parents=True, exist_ok=True)
    trace.unlink(missing_ok=True)
    tree = setting.compare_tree if setup == "fresh, compared tree" else None
    env = setting.env(work, "cache-kept" if setup == "reused" else "cache", trace, tree)
    cli = mneme_command() if setting.engine == "test" or tree else mneme_cli()
    command = [*cli, "tune", "-rdb", database, *SPACES[space], *setting.engine_args(), "--results-dir", str(results),
               "--quiet"]
    launched = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=work, timeout=600)
    ended = time.time()
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    points = startup_trace.read(trace)
    run = runs_points(Run(space, index, setup, end_s=ended - launched), points, launched)
    summary = json.loads((results / "summary.json").read_text())
    run.trials, run.verified = summary["trials"], summary["verified"]
    wait_gone({p["pid"] for p in points})
    return run


def wait_gone(pids: set[int], seconds: float = 60.0) -> None:
    """Wait until the processes ``pids`` have exited (a run's servers tear down after the command exits)."""
    deadline = time.monotonic() + seconds
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.02)


class KeptServer:
    """``mneme serve --local`` for the ``reused`` setup, with a cache directory of its own (the other setups
    do not find it); one uncounted tune run has it restore the instance, as a user's first run would."""

    def __init__(self, database: str, work: Path, setting: Setting) -> None:
        command = [*(mneme_command() if setting.engine == "test" else mneme_cli()), "serve", "--local", "--gpu",
                   "0", "--store", str(Path(database).parent), "--keep-alive", str(KEPT_SERVER_KEEP_ALIVE_S),
                   "--log-level", "WARNING", *(["--engine", TEST_ENGINE] if setting.engine == "test" else [])]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=work,
                                        env=setting.env(work, "cache-kept", None))
        line = self.process.stdout.readline()
        if "listening on" not in line:
            self.stop()
            raise SystemExit(f"mneme serve --local did not start: {line!r}")
        self.first = None

    def warm(self, space: str, database: str, work: Path, setting: Setting) -> Run:
        self.first = one_run(space, -1, database, work, setting, "reused")
        if self.first.at("executor.reused") is None:
            raise SystemExit("the reused setup did not find the server left running (see replay_server/kept_servers.py)")
        return self.first

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


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
    labels = list(dict.fromkeys((r.space, r.setup) for r in runs))
    columns: list[tuple[str, list[Run]]] = []
    only_fresh = all(setup == "fresh" for _, setup in labels)
    for space, setup in labels:
        mine = [r for r in runs if (r.space, r.setup) == (space, setup)]
        name = space if only_fresh else f"{space}, {setup}"
        columns.append((f"{name}: first", mine[:1]))
        if len(mine) > 1:
            columns.append((f"{name}: median of {len(mine) - 1}", mine[1:]))
    header = "| phase (s) | " + " | ".join(label for label, _ in columns) + " |"
    lines = [header, "|" + " --- |" * (len(columns) + 1)]

    def row(label: str, value) -> None:
        lines.append(f"| {label} | " + " | ".join(fmt(median([value(r) for r in group])) for _, group in columns) + " |")

    for label, start, end in PHASES + (REUSED_PHASES if any(r.setup == "reused" for r in runs) else []):
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


def spread(values: list[float]) -> str:
    return f"{fmt(median(values))} ({fmt(min(values))}..{fmt(max(values))})"


def ratio(mine: list[float], base: list[float]) -> str:
    """Of the medians, and the range of the run-by-run ratios (the runs were interleaved)."""
    pairs = [a / b for a, b in zip(mine, base) if b]
    return f"{median(mine) / median(base):.2f}x ({min(pairs):.2f}..{max(pairs):.2f})" if pairs else "-"


def summary_table(runs: list[Run], first_reused: dict[str, Run]) -> str:
    """Per space and setup: time to the first verified result and end to end, beside ``fresh``."""
    lines = ["| space, setup | runs | first verified result (s) | vs fresh | end to end (s) | vs fresh |",
             "| --- | --- | --- | --- | --- | --- |"]
    for space in dict.fromkeys(r.space for r in runs):
        base = [r for r in runs if r.space == space and r.setup == "fresh"]
        for setup in dict.fromkeys(r.setup for r in runs if r.space == space):
            mine = [r for r in runs if r.space == space and r.setup == setup]
            first, end = [r.first_s or 0.0 for r in mine], [r.end_s for r in mine]
            compared = base and setup != "fresh"
            lines.append(f"| {space}, {setup} | {len(mine)} | {spread(first)} | "
                         f"{ratio(first, [r.first_s or 0.0 for r in base]) if compared else '1'} | {spread(end)} | "
                         f"{ratio(end, [r.end_s for r in base]) if compared else '1'} |")
        if space in first_reused:
            r = first_reused[space]
            lines.append(f"| {space}, reused: the server's first run (not counted) | 1 | {fmt(r.first_s)} | - | "
                         f"{fmt(r.end_s)} | - |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per space (the first has a cold compile cache)")
    parser.add_argument("--spaces", nargs="+", choices=list(SPACES), default=list(SPACES))
    parser.add_argument("--setups", nargs="+", choices=["fresh", "reused"], default=["fresh", "reused"],
                        help="fresh: the run starts its own local server; reused: it finds one left running")
    parser.add_argument("--engine", choices=["cuda", "test"], default="cuda",
                        help="test: no GPU, a synthetic recording and the test engine (replay_server/testing/fake_engine.py)")
    parser.add_argument("--replay-us", type=float, default=100.0, help="--engine test: what a replay costs (sleep)")
    parser.add_argument("--compile-ms", type=float, default=10.0, help="--engine test: what a compile costs (sleep)")
    parser.add_argument("--compare-tree", metavar="DIR",
                        help="also run `fresh` with the mneme source tree in DIR (git archive REV | tar -x -C DIR)")
    parser.add_argument("--work", help="working directory (default: a temporary one, removed)")
    parser.add_argument("--json", help="also write every run's points here")
    args = parser.parse_args(argv)
    if args.compare_tree and not (Path(args.compare_tree) / "mneme" / "__init__.py").is_file():
        parser.error(f"--compare-tree {args.compare_tree}: no mneme/ source tree there")
    setting = Setting(args.engine, args.replay_us, args.compile_ms,
                      str(Path(args.compare_tree).resolve()) if args.compare_tree else None)
    setups = list(args.setups) + (["fresh, compared tree"] if args.compare_tree else [])
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="mneme-tune-startup-"))
    work.mkdir(parents=True, exist_ok=True)
    kept: KeptServer | None = None
    first_reused: dict[str, Run] = {}
    try:
        database = prepare_recording(work, setting)
        if "reused" in setups:
            kept = KeptServer(database, work, setting)
            first_reused = {space: kept.warm(space, database, work, setting) for space in args.spaces}
        runs = [one_run(space, i, database, work, setting, setup)
                for i in range(args.repeats) for space in args.spaces for setup in setups]
    finally:
        if kept is not None:
            kept.stop()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    runs.sort(key=lambda r: (args.spaces.index(r.space), setups.index(r.setup), r.index))
    if args.engine == "test":
        device = f"the test engine (no GPU; replay {args.replay_us:g} us, compile {args.compile_ms:g} ms), " \
                 f"{os.cpu_count()} CPUs"
    else:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True).stdout.strip().splitlines()
        device = gpu[0] if gpu else "an unknown GPU"
    print(f"mneme tune start-up on {device}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{args.repeats} run(s) per space and setup")
    print(table(runs))
    print()
    print(summary_table(runs, first_reused))
    for setup in setups:
        launch = [r for r in runs if r.space == "launch" and r.setup == setup]
        if launch and args.engine == "cuda":
            first, end = median([r.first_s for r in launch]), median([r.end_s for r in launch])
            print(f"launch preset, {setup}, median of {len(launch)}: first verified result {fmt(first)} s (target "
                  f"{TARGET_FIRST_S} s: {'met' if first is not None and first <= TARGET_FIRST_S else 'NOT met'}), "
                  f"end to end {fmt(end)} s (target {TARGET_END_S} s: {'met' if end <= TARGET_END_S else 'NOT met'})")
    if args.json:
        Path(args.json).write_text(json.dumps([vars(r) for r in runs], indent=2))
    return 0


if __name__ == "__main__":
    from results_file import record_output  # bench/results/NAME.md

    raise SystemExit(record_output("tune_startup", main))
