"""Fresh data and start-up: `bench/record_overhead.py --fresh`.

A short program whose one recorded instance is GBs of memory that really
changed: bench/apps/stencil_app.cu at N=580 (1.56 GB of device state, two
float32 grids), its sweeps calibrated to run ~1.5 s. Every byte its instance
holds is new to the recording, so the whole capture pipeline runs on it: the
GPU digests and the copy off the device (the application's stall), then the
agent's read, hash, probe/compress and write of every piece, the snapshot
files and the commit (the database; with ``--durable`` a ``syncfs`` first). Variants, interleaved run
by run:

* no recording;
* `mneme record -mr 1 -sr 1`: the second sweep is recorded (its prologue holds
  both grids, initial and once swept; its epilogue the grid it wrote), so the
  agent converts while the program goes on;
* `mneme record -mr 1 --instances S-2` (S sweeps): the second-last sweep, so
  the program exits right after and the command waits for all of the conversion.

Reported: the application's wall (exec to exit) and the command's, their
difference to the plain run, and the pipeline's stages in GB/s: the copy off
the GPU (bytes copied / stall without the digests), hash, probe + compress and
write per thread (bytes / thread-seconds) and the pool's threads, the
snapshot files and the commit, the conversion (new data / its wall time) and
the pipeline (new data / (stall + conversion)).

Start-up of the command itself: `mneme record --help`, and the time from the
command's start to the application's exec (a program that prints the time),
beside `python -c pass` (the interpreter alone); wall time (median) and CPU
time (least), the modules' bytecode cached as an installed mneme has it.
`--compare-tree DIR` times another mneme source tree the same way,
interleaved run by run (a before/after on a loaded machine).

Targets: pipeline >= 10 GB/s on new data; `mneme record` within +1.0 s of the
plain run; the command's start-up under 0.1 s.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record_app_scale import App, Run, build, iterations_for, run_plain, run_recorded
from results_file import write_section

ROOT = Path(__file__).resolve().parents[1]
NAN = float("nan")


def _median(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r.command_s)[len(runs) // 2]


def _rate(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else NAN


def fresh_rows(exe: Path, n: int, sweeps: int, repeats: int, lib: str | None, timeout: float) -> list[dict]:
    app = App(f"stencil_app {n},{sweeps}", [str(exe), str(n), str(sweeps)])
    variants = [
        ("early instance (-mr 1 -sr 1)", ["-mr", "1", "-sr", "1"]),
        (f"last instance (-mr 1 --instances {sweeps - 2})", ["-mr", "1", "--instances", str(sweeps - 2)]),
    ]
    runs: list[list[Run]] = [[] for _ in range(1 + len(variants))]
    run_plain(app, timeout)  # warm the driver and the file cache
    for _ in range(repeats):
        runs[0].append(run_plain(app, timeout))
        for i, (name, options) in enumerate(variants, 1):
            runs[i].append(run_recorded(app, name, options, lib, timeout))
    plain = _median(runs[0]).command_s
    rows = [{"variant": "no recording", "app_s": plain, "command_s": plain}]
    for r in (_median(x) for x in runs[1:]):
        s = r.stats or {}
        p, entries = s.get("pipeline", {}), s.get("entries", [])
        copied = s.get("copied_bytes", 0)
        stall = s.get("stall_s", 0.0)
        digest = sum(e.get("digest_s", 0.0) for e in entries)
        convert = sum(e["convert_s"] for e in entries)
        rows.append({
            "variant": r.variant, "app_s": r.app_s, "command_s": r.command_s, "extra_s": r.command_s - plain,
            "app_extra_s": r.app_s - plain, "instances": s.get("instances", 0), "state_gb": s.get("snapshot_bytes", 0) / 1e9,
            "new_gb": copied / 1e9, "stored_gb": s.get("stored_bytes", 0) / 1e9, "stall_s": stall,
            "copy_gb_s": _rate(copied, stall - digest),
            "hash_gb_s": _rate(p.get("hashed_bytes", 0), p.get("hash_s", 0)),
            "compress_gb_s": _rate(p.get("compressed_bytes", 0) + p.get("raw_bytes", 0), p.get("compress_s", 0)),
            "write_gb_s": _rate(p.get("stored_bytes", 0), p.get("write_s", 0)),
            "read_gb_s": _rate(p.get("bytes", 0), p.get("read_s", 0)),
            "threads": p.get("workers", 0), "chunks_s": p.get("wall_s", 0.0), "snapshot_s": p.get("snapshot_s", 0.0),
            "commit_s": p.get("commit_s", 0.0), "convert_s": convert, "convert_gb_s": _rate(copied, convert),
            "pipeline_gb_s": _rate(copied, stall + convert),
            "pipeline_no_commit_gb_s": _rate(copied, stall + convert - p.get("commit_s", 0.0)),
            "after_exit_s": s.get("after_exit_s", 0.0),
            "runs": [round(x.command_s, 3) for x in runs[1 + [v for v, _ in variants].index(r.variant)]],
        })
    return rows


def _timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system of the child) of one run."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def _tree_env(tree: Path, lib: str | None, cache: str) -> dict[str, str]:
    """The environment that runs ``python -m mneme`` from ``tree``, with its bytecode cached (as installed)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])),
               PYTHONPYCACHEPREFIX=cache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed mneme has its .pyc files: measure with them
    if lib:
        env["MNEME_RECORDER_LIB"] = lib
    return env


def startup_rows(lib: str | None, repeats: int, compare: Path | None = None) -> list[dict]:
    """The command's own start-up: `--help`, command start -> application exec, and the interpreter alone.

    Wall time is the median run, CPU time (the child's user + system) the least: on a shared machine other
    processes' load lengthens the wall time and only adds to the CPU time. With ``compare`` (another mneme
    tree), both trees are measured run by run, interleaved.
    """
    trees = [ROOT] + ([compare] if compare else [])
    mneme = [sys.executable, "-m", "mneme"]
    runs: dict[tuple[int, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="mneme-bench-startup-") as tmp:
        envs = [_tree_env(tree, lib, f"{tmp}/pycache") for tree in trees]
        stamp = Path(tmp) / "exec_time"
        app = [sys.executable, "-S", "-c", f"import time; open({str(stamp)!r}, 'w').write(repr(time.time()))"]
        for env in envs:
            _timed([*mneme, "record", "--help"], env)  # compile and cache the modules once
            _timed([*mneme, "record", "-rdb", str(Path(tmp) / "rdb"), "--", *app], env)
        for _ in range(repeats):
            bare = time.time()
            subprocess.run(app, check=True)
            app_start = float(stamp.read_text()) - bare
            for k, env in enumerate(envs):
                runs.setdefault((k, "pass"), []).append(_timed([sys.executable, "-c", "pass"], env))
                runs.setdefault((k, "help"), []).append(_timed([*mneme, "record", "--help"], env))
                t0 = time.time()
                wall, cpu = _timed([*mneme, "record", "-rdb", str(Path(tmp) / "rdb"), "--", *app], env)  # exits 2
                runs.setdefault((k, "exec"), []).append((float(stamp.read_text()) - t0 - app_start, cpu))
                runs.setdefault((k, "total"), []).append((wall - app_start, cpu))
    what = {
        "pass": "`python -c pass` (the interpreter alone)",
        "help": "`mneme record --help`",
        "exec": "`mneme record`: command start to the application's exec",
        "total": "`mneme record` around a program without CUDA, start to exit",
    }
    rows = []
    for key, label in what.items():
        row = {"what": label}
        for k, tree in enumerate(trees):
            walls, cpus = zip(*runs[(k, key)])
            row[f"seconds{k}"] = statistics.median(walls)
            row[f"cpu{k}"] = min(cpus) if key not in ("exec",) else float("nan")  # the exec run's CPU is its whole run
        rows.append(row)
    for row in rows:
        row["seconds"] = row["seconds0"]
    if compare:
        rows.append({"what": f"trees: this one ({ROOT}), compared: {compare}"})
    return rows


def tables(fresh: list[dict], startup: list[dict]) -> str:
    lines = []
    if fresh:
        lines += [
            "Fresh data: wall time (median run) and the pipeline's stages (per-thread rates: bytes / thread-seconds; "
            "copy off the GPU: bytes copied / stall without the GPU digests; pipeline: new data / (stall + conversion)):",
            "",
            "| variant | app wall [s] | `mneme record` wall [s] | command extra [s] | device state GB | new data GB | stored GB | "
            "stall [s] | copy off the GPU GB/s | read GB/s/thread | hash GB/s/thread | probe + compress GB/s/thread | "
            "write GB/s/thread | threads | chunks [s] | snapshots [s] | commit [s] | conversion [s] | conversion GB/s | "
            "pipeline GB/s | pipeline without the commit GB/s | after exit [s] |",
            "| " + " | ".join(["---"] * 22) + " |",
        ]
        for r in fresh:
            if r["variant"] == "no recording":
                lines.append(f"| no recording | {r['app_s']:.2f} |" + " |" * 20)
                continue
            lines.append(
                f"| {r['variant']} | {r['app_s']:.2f} | {r['command_s']:.2f} | {r['extra_s']:+.2f} | {r['state_gb']:.2f} | "
                f"{r['new_gb']:.2f} | {r['stored_gb']:.2f} | {r['stall_s']:.3f} | {r['copy_gb_s']:.1f} | {r['read_gb_s']:.2f} | "
                f"{r['hash_gb_s']:.2f} | {r['compress_gb_s']:.2f} | {r['write_gb_s']:.2f} | {r['threads']} | {r['chunks_s']:.3f} | "
                f"{r['snapshot_s']:.3f} | {r['commit_s']:.3f} | {r['convert_s']:.3f} | {r['convert_gb_s']:.1f} | "
                f"**{r['pipeline_gb_s']:.1f}** | {r['pipeline_no_commit_gb_s']:.1f} | {r['after_exit_s']:.2f} |")
        lines.append("")
    if startup:
        compared = "seconds1" in startup[0]
        lines += ["Start-up of the command (wall: the median run; CPU: the least, user + system; bytecode cached"
                  + (", this tree and the compared one interleaved run by run" if compared else "") + "):", ""]
        if compared:
            lines += ["| what | [s] | CPU [s] | compared tree [s] | compared tree CPU [s] |", "| --- | --- | --- | --- | --- |"]
        else:
            lines += ["| what | [s] | CPU [s] |", "| --- | --- | --- |"]
        for r in startup:
            if "seconds0" not in r:
                lines += ["", r["what"]]
                continue
            cells = [f"{r['seconds0']:.3f}", _cpu_cell(r["cpu0"])]
            if compared:
                cells += [f"{r['seconds1']:.3f}", _cpu_cell(r["cpu1"])]
            lines.append(f"| {r['what']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cpu_cell(seconds: float) -> str:
    return "" if seconds != seconds else f"{seconds:.3f}"  # nan: not measured


def main(args) -> int:
    from mneme._internal.native_libs import recorder_library

    lib = args.recorder_lib or str(recorder_library())
    fresh: list[dict] = []
    if args.fresh_n:
        with tempfile.TemporaryDirectory(prefix="mneme-fresh-") as tmp:
            exe = build(Path(tmp), ROOT / "bench" / "apps" / "stencil_app.cu", "stencil_app")
            sweeps = args.fresh_sweeps or iterations_for(exe, str(args.fresh_n), args.fresh_target_s, args.app_timeout)
            fresh = fresh_rows(exe, args.fresh_n, max(sweeps, 4), args.fresh_repeats, lib, args.app_timeout)
    startup = startup_rows(lib, args.startup_repeats, Path(args.compare_tree) if args.compare_tree else None)
    text = tables(fresh, startup)
    print("\n" + text)
    if args.results:
        title = "fresh data and start-up (--fresh)" if fresh else "start-up (--fresh --fresh-n 0)"
        write_section(args.results, title, text, heading="Recording cost: measured")
    return 0


def add_arguments(ap) -> None:
    group = ap.add_argument_group("fresh data and start-up (--fresh)")
    group.add_argument("--fresh", action="store_true", help="time a short program whose recorded instance is GBs of new data")
    group.add_argument("--fresh-n", type=int, default=580, help="stencil_app N (580: 1.56 GB of device state; 0: start-up only)")
    group.add_argument("--fresh-sweeps", type=int, default=0, help="sweeps (default: as many as make --fresh-target-s)")
    group.add_argument("--fresh-target-s", type=float, default=1.5, help="run time the sweeps aim at (default 1.5 s)")
    group.add_argument("--fresh-repeats", type=int, default=3, help="runs per variant (default 3)")
    group.add_argument("--startup-repeats", type=int, default=7, help="runs of each start-up measurement (default 7)")
    group.add_argument("--compare-tree", metavar="DIR",
                       help="also time the start-up of the mneme source tree in DIR (e.g. `git archive main`), interleaved")
    group.add_argument("--results", help="also write the tables into this markdown file (e.g. bench/results/record_overhead.md)")


if __name__ == "__main__":
    raise SystemExit("run it as: python bench/record_overhead.py --fresh [...]")

