"""Recording cost at application scale (issue 19): `bench/record_overhead.py --app-scale`.

Long, memory-heavy iterative programs written for this (bench/apps/): a CG
solver (`cg_app`, 4.5 GB of device state at NX=230) and a 3-D Jacobi stencil
(`stencil_app`, 8.6 GB at N=1024), plus the headline's CG example
(examples/minife_cg, default size). Each is run without recording, under
`mneme record` with the default settings and with `-mr 1`, the variants
interleaved run by run. Reported separately: the application's own wall time
(exec to exit: the agent's `app_s`) and the `mneme record` command's wall
time; and the breakdown the agent writes (MNEME_RECORD_STATS): the stall
inside the application per instance (prologue + epilogue capture) and the
snapshot GB/s, the agent's hashing/compression GB/s per thread, what the
content index spared, the conversion throughput and the conversion time left
after the application exited.

Sizes and iteration counts are options, so a smaller run fits a device budget.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class App:
    name: str
    command: list[str]
    record_args: list[str] = field(default_factory=list)


@dataclass
class Run:
    app: str
    variant: str
    command_s: float  # what the bench timed: the app alone, or the whole `mneme record`
    app_s: float  # the application's own run (exec to exit)
    stats: dict | None = None


def build(tmp: Path, source: Path, name: str) -> Path:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    exe = tmp / name
    subprocess.run([nvcc, "-O3", "-arch=sm_90", "-o", exe, source], check=True)
    return exe


def build_example(tmp: Path, name: str) -> Path:
    subprocess.run(["make", "-s", "-C", str(ROOT / "examples" / name), f"BUILD={tmp}"], check=True)
    return tmp / {"minife_cg": "cg"}.get(name, name)


def main_ms(cmd: list[str], timeout: float) -> float:
    """The application's own main() time (the JSON line bench/apps programs print)."""
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["main_ms"])


def iterations_for(exe: Path, size: str, target_s: float, timeout: float) -> int:
    """Iterations that make the program run ``target_s`` seconds: timed at 100 and 600 iterations."""
    short, long = main_ms([str(exe), size, "100"], timeout), main_ms([str(exe), size, "600"], timeout)
    per_iteration = max((long - short) / 500, 1e-3)
    fixed = max(short - 100 * per_iteration, 0.0)
    return max(1, int((target_s * 1e3 - fixed) / per_iteration))


def _run(cmd: list[str], env: dict[str, str] | None, timeout: float) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return elapsed


def run_plain(app: App, timeout: float) -> Run:
    t = _run(app.command, None, timeout)
    return Run(app.name, "no recording", t, t)


def run_recorded(app: App, variant: str, options: list[str], lib: str | None, timeout: float) -> Run:
    rdb = tempfile.mkdtemp(prefix="mneme-bench-rdb-")
    stats_file = Path(rdb + ".stats.json")
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, MNEME_RECORD_STATS=str(stats_file))
    if lib:
        env["MNEME_RECORDER_LIB"] = lib
    cmd = [sys.executable, "-m", "mneme", "record", "-rdb", rdb, *app.record_args, *options, "--", *app.command]
    try:
        t = _run(cmd, env, timeout)
        stats = json.loads(stats_file.read_text())
    finally:
        shutil.rmtree(rdb, ignore_errors=True)
        stats_file.unlink(missing_ok=True)
    return Run(app.name, variant, t, stats["app_s"], stats)


VARIANTS = [("mneme record (defaults)", []), ("mneme record -mr 1", ["-mr", "1"])]


def measure(apps: list[App], repeats: int, lib: str | None, timeout: float) -> list[list[Run]]:
    """Per app and variant, the runs (variants interleaved within each repeat)."""
    table: list[list[Run]] = []
    for app in apps:
        rows: list[list[Run]] = [[] for _ in range(1 + len(VARIANTS))]
        for _ in range(repeats):
            rows[0].append(run_plain(app, timeout))
            for i, (variant, options) in enumerate(VARIANTS, 1):
                rows[i].append(run_recorded(app, variant, options, lib, timeout))
        table += rows
    return table


def median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r.command_s)[len(runs) // 2]


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f}"


def report(table: list[list[Run]]) -> list[dict]:
    rows = []
    base: dict[str, float] = {}
    for runs in table:
        r = median_run(runs)
        if r.stats is None:
            base[r.app] = r.app_s
        plain = base[r.app]
        s = r.stats or {}
        entries = s.get("entries", [])
        pipe, rates = s.get("pipeline", {}), s.get("rates", {})
        snap = s.get("snapshot_bytes", 0)
        stall = s.get("stall_s", 0.0)
        convert = sum(e["convert_s"] for e in entries)
        rows.append({
            "app": r.app, "variant": r.variant, "app_s": r.app_s, "command_s": r.command_s,
            "app_overhead_pct": 100 * (r.app_s / plain - 1), "command_overhead_pct": 100 * (r.command_s / plain - 1),
            "instances": s.get("instances", 0), "snapshot_gb": snap / 1e9, "copied_gb": s.get("copied_bytes", 0) / 1e9,
            "digest_s": sum(e.get("digest_s", 0.0) for e in entries), "stored_gb": s.get("stored_bytes", 0) / 1e9,
            "stall_s": stall, "spool_wait_s": s.get("spool_wait_s", 0.0), "stall_per_instance_s": stall / len(entries) if entries else 0.0,
            "snapshot_gb_s": snap / stall / 1e9 if stall else float("nan"),
            "hash_gb_s_thread": rates.get("hash_gb_s_per_thread", float("nan")),
            "compress_gb_s_thread": rates.get("compress_gb_s_per_thread", float("nan")),
            "known_pct": 100 * pipe.get("known_bytes", 0) / pipe["bytes"] if pipe.get("bytes") else float("nan"),
            "convert_s": convert, "agent_gb_s": snap / convert / 1e9 if convert else float("nan"),
            "pipeline_gb_s": snap / (stall + convert) / 1e9 if stall + convert else float("nan"),
            "after_exit_s": s.get("after_exit_s", 0.0), "repeats": len(runs),
            "runs_command_s": [x.command_s for x in runs], "runs_app_s": [x.app_s for x in runs],
        })
    return rows


def print_tables(rows: list[dict]) -> str:
    """Print the two tables; returns their text (markdown)."""
    out = ["Application scale: wall time (median run), the application's own (exec to exit) and the `mneme record` command's", "",
           "| app | variant | app wall [s] | app overhead | `mneme record` wall [s] | command overhead | instances | captured GB | "
           "copied off the GPU GB | stored GB |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        rec = r["variant"] != "no recording"
        out.append(f"| {r['app']} | {r['variant']} | {r['app_s']:.2f} | {'%+.1f%%' % r['app_overhead_pct'] if rec else ''} | "
                   f"{r['command_s']:.2f} | {'%+.1f%%' % r['command_overhead_pct'] if rec else ''} | "
                   f"{r['instances'] if rec else ''} | {'%.2f' % r['snapshot_gb'] if rec else ''} | {'%.2f' % r['copied_gb'] if rec else ''} | "
                   f"{'%.2f' % r['stored_gb'] if rec else ''} |")
    out += ["", "Where recording's time goes (per recorded variant): stall inside the application, the agent's stages", "",
            "| app | variant | stall [s] | of which GPU digests [s] | waited for the agent [s] | stall per instance [s] | snapshot GB/s | "
            "hash GB/s/thread | compress GB/s/thread | named from the index | agent conversion [s] | agent GB/s | pipeline GB/s | "
            "conversion after exit [s] |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["variant"] == "no recording":
            continue
        out.append(f"| {r['app']} | {r['variant']} | {r['stall_s']:.2f} | {r['digest_s']:.3f} | {r['spool_wait_s']:.2f} | "
                   f"{r['stall_per_instance_s']:.3f} | {r['snapshot_gb_s']:.1f} | {r['hash_gb_s_thread']:.2f} | "
                   f"{r['compress_gb_s_thread']:.2f} | {r['known_pct']:.0f}% | {r['convert_s']:.2f} | {r['agent_gb_s']:.1f} | "
                   f"{r['pipeline_gb_s']:.1f} | {r['after_exit_s']:.2f} |")
    text = "\n".join(out)
    print("\n" + text)
    return text


def main(args) -> int:
    with tempfile.TemporaryDirectory(prefix="mneme-app-scale-") as tmp:
        tmp_path = Path(tmp)
        apps = []
        vass = ["-vass", str(args.vass)]
        for name, spec in (("cg_app", args.cg), ("stencil_app", args.stencil)):
            if not spec:
                continue
            size, _, iterations = spec.partition(",")
            exe = build(tmp_path, ROOT / "bench" / "apps" / f"{name}.cu", name)
            n = int(iterations) if iterations else iterations_for(exe, size, args.target_s, args.app_timeout)
            apps.append(App(f"{name} {size},{n}", [str(exe), size, str(n)], vass))
        if args.example_cg:
            exe = build_example(tmp_path, "minife_cg")
            _run([str(exe)], None, args.app_timeout)  # warm the driver and the file cache
            apps.append(App("minife_cg (headline)", [str(exe)]))
        from mneme._internal.native_libs import recorder_library

        lib = args.recorder_lib or str(recorder_library())
        rows = report(measure(apps, args.app_repeats, lib, args.app_timeout))
    text = print_tables(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"app_scale": rows}, indent=1))
    if getattr(args, "results", None):
        from results_file import write_section

        write_section(args.results, "application scale (--app-scale)", text, heading="Recording cost: measured")
    return 0


def add_arguments(ap) -> None:
    group = ap.add_argument_group("application scale (--app-scale)")
    group.add_argument("--app-scale", action="store_true", help="time the application-scale programs instead (issue 19)")
    group.add_argument("--cg", default="230", help="cg_app NX[,ITERATIONS] ('' skips it; 230: 4.5 GB of device state; "
                       "no ITERATIONS: as many as make --target-s seconds)")
    group.add_argument("--stencil", default="1024", help="stencil_app N[,SWEEPS] ('' skips it; 1024: 8.6 GB)")
    group.add_argument("--target-s", type=float, default=22.0, help="run time the iteration counts aim at (default 22 s)")
    group.add_argument("--example-cg", action=argparse.BooleanOptionalAction, default=True, help="also the headline's minife_cg example")
    group.add_argument("--vass", type=float, default=24, help="-vass GIB for the large programs (the window must hold their state)")
    group.add_argument("--app-repeats", type=int, default=1, help="runs per variant (default 1: these runs are long)")
    group.add_argument("--app-timeout", type=float, default=300, help="seconds one run may take")


if __name__ == "__main__":
    raise SystemExit("run it as: python bench/record_overhead.py --app-scale [...]")
