"""Recording cost of Python/ML programs (issue 23): `bench/record_overhead.py --only-apps`.

A small PyTorch program (bench/apps/torch_program.py: elementwise ops, a
cuBLAS matmul, a softmax) and a Triton program (bench/apps/triton_program.py:
one `@triton.jit` add kernel), each run without recording, with
`CUDA_MODULE_LOADING=EAGER` alone (what recording cost before lazy loading was
supported), and under `mneme record` with a filter that records nothing, with
one instance of one kernel (`--kernel K -mr 1`) and with the defaults. The
variants run interleaved, repeat by repeat; medians are reported, with the
application's own time (exec to exit) beside the whole command's.

Targets: the filter that records nothing costs <= 5% (or <= 0.3 s) on the
PyTorch program; recording one instance costs <= 1 s more than that.
A program whose framework is not installed is skipped, with the reason.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path

from record_app_scale import ROOT, App, Run, _run, run_recorded

APPS = {
    # name: (program, modules it needs, the kernel regex of the one-instance variant)
    "pytorch": ("torch_program.py", ("torch",), "[Ss]oft[Mm]ax"),
    "triton": ("triton_program.py", ("torch", "triton"), "add_kernel"),
}
NOTHING = "^no_such_kernel$"
TARGET_NOTHING_PCT, TARGET_NOTHING_S, TARGET_ONE_S = 5.0, 0.3, 1.0


def variants(kernel: str) -> list[tuple[str, list[str] | None, dict[str, str]]]:
    """(name, `mneme record` options or None for the bare program, extra environment)."""
    return [
        ("no recording", None, {}),
        ("no recording, CUDA_MODULE_LOADING=EAGER", None, {"CUDA_MODULE_LOADING": "EAGER"}),
        ("mneme record, filter records nothing", ["--kernel", NOTHING], {}),
        (f"mneme record --kernel {kernel} -mr 1", ["--kernel", kernel, "-mr", "1"], {}),
        ("mneme record (defaults)", [], {}),
    ]


def run_variant(app: App, name: str, options: list[str] | None, env: dict[str, str], lib: str | None,
                timeout: float) -> Run:
    if options is None:
        t = _run(app.command, dict(os.environ, **env), timeout)
        return Run(app.name, name, t, t)
    return run_recorded(app, name, options, lib, timeout)


def measure(app: App, kernel: str, repeats: int, lib: str | None, timeout: float) -> list[list[Run]]:
    table: list[list[Run]] = [[] for _ in variants(kernel)]
    _run(app.command, None, timeout)  # warm the file cache (and Triton's kernel cache)
    for repeat in range(repeats):
        for i, (name, options, env) in enumerate(variants(kernel)):
            run = run_variant(app, name, options, env, lib, timeout)
            table[i].append(run)
            # A line per run: a run cut short (a device call's time limit) still leaves its numbers.
            print(f"{app.name} repeat {repeat + 1}/{repeats}: {name}: {run.command_s:.2f} s "
                  f"(application {run.app_s:.2f} s)", flush=True)
    return table


def rows_of(table: list[list[Run]]) -> list[dict]:
    rows = []
    base_cmd = statistics.median(r.command_s for r in table[0])
    base_app = statistics.median(r.app_s for r in table[0])
    for runs in table:
        s = runs[len(runs) // 2].stats or {}  # any run: the recorded bytes do not vary
        sizes = sorted(e["snapshot_bytes"] for e in s.get("entries", []))
        cmd, app_s = statistics.median(r.command_s for r in runs), statistics.median(r.app_s for r in runs)
        rows.append({
            "app": runs[0].app, "variant": runs[0].variant, "command_s": cmd, "app_s": app_s,
            "extra_s": cmd - base_cmd, "extra_pct": 100 * (cmd / base_cmd - 1), "app_extra_s": app_s - base_app,
            "instances": s.get("instances", 0), "captured_mb": s.get("snapshot_bytes", 0) / 1e6,
            "largest_instance_mb": sizes[-1] / 1e6 if sizes else 0.0, "stall_s": s.get("stall_s", 0.0),
            "runs_command_s": [r.command_s for r in runs], "runs_app_s": [r.app_s for r in runs],
        })
    return rows


def targets(rows: list[dict]) -> list[str]:
    """The issue's targets on the PyTorch program, met or not, with the numbers."""
    torch_rows = {r["variant"]: r for r in rows if r["app"] == "pytorch"}
    nothing = torch_rows.get("mneme record, filter records nothing")
    one = next((r for v, r in torch_rows.items() if v.endswith("-mr 1")), None)
    if not nothing or not one:
        return []
    ok1 = nothing["extra_pct"] <= TARGET_NOTHING_PCT or nothing["extra_s"] <= TARGET_NOTHING_S
    ok2 = one["command_s"] - nothing["command_s"] <= TARGET_ONE_S
    return [
        f"target: filter that records nothing <= {TARGET_NOTHING_PCT:g}% or <= {TARGET_NOTHING_S} s: "
        f"{nothing['extra_s']:+.2f} s ({nothing['extra_pct']:+.1f}%; the application itself {nothing['app_extra_s']:+.2f} s): "
        f"{'met' if ok1 else 'NOT met'}",
        f"target: one instance <= {TARGET_ONE_S:g} s more than that: {one['command_s'] - nothing['command_s']:+.2f} s: "
        f"{'met' if ok2 else 'NOT met'}",
    ]


def print_table(rows: list[dict], repeats: int) -> None:
    print(f"\nPython and ML programs: wall time, median of {repeats} interleaved runs (extra: against no recording)")
    print("| program | variant | `mneme record` / program wall [s] | extra [s] | extra | application's own [s] | "
          "instances | captured MB | largest instance MB | stall [s] |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        rec = r["instances"] or r["variant"].startswith("mneme")
        print(f"| {r['app']} | {r['variant']} | {r['command_s']:.2f} | {r['extra_s']:+.2f} | {r['extra_pct']:+.1f}% | "
              f"{r['app_s']:.2f} | {r['instances'] if rec else ''} | {'%.1f' % r['captured_mb'] if rec else ''} | "
              f"{'%.1f' % r['largest_instance_mb'] if rec else ''} | {'%.2f' % r['stall_s'] if rec else ''} |")
    for line in targets(rows):
        print(line)


def main(args: argparse.Namespace) -> int:
    from mneme._internal.native_libs import recorder_library

    lib = args.recorder_lib or str(recorder_library())
    rows = []
    for name, (program, modules, kernel) in APPS.items():
        if args.apps and name not in args.apps.split(","):
            continue
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
        if missing:
            print(f"{name}: skipped ({', '.join(missing)} not installed)")
            continue
        app = App(name, [sys.executable, str(ROOT / "bench" / "apps" / program)])
        rows += rows_of(measure(app, kernel, args.app_repeats, lib, args.app_timeout))
    print_table(rows, args.app_repeats)
    if args.json:
        Path(args.json).write_text(json.dumps({"frameworks": rows}, indent=1))
    return 0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--only-apps", action="store_true",
                    help="time only the PyTorch and Triton programs (issue 23; runs per variant: --app-repeats)")
    ap.add_argument("--apps", default="", help=f"with --only-apps: which of {', '.join(APPS)} (default: all)")


if __name__ == "__main__":
    raise SystemExit("run it as: python bench/record_overhead.py --only-apps [--app-repeats 5]")
