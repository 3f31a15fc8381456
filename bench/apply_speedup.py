"""Does a tuned kernel make the application faster? `mneme tune`, then `mneme run --apply`, side by side.

    python bench/apply_speedup.py [--out DIR] [--workloads minife_cg stencil3d] [--repeats 3] [--trials 32]

For each workload (the CG solver's SpMV, the 3-D stencil's Jacobi sweep):
builds the example, records one steady-state launch of its main kernel
(``mneme record --kernel K -sr 2 -mr 1``), tunes it (``mneme tune``, TPE over
the standard space with every block shape up to 1024 threads), then runs the
application plain and under ``mneme run --apply RESULTS`` alternately
``--repeats`` times. Both must print PASS (the application's own check). The
table sets the speedup the tuner predicted (replayed best against replayed
baseline) beside the one measured in the application (median of the kernel
time it prints, plain against applied), with wall times and the apply
library's report. Results also go to DIR/apply_speedup.json.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import headline_apps as apps  # noqa: E402
from headline import default_arch, gpu_description  # noqa: E402

WORKLOADS = ("minife_cg", "stencil3d")
_APPLIED = re.compile(r"^mneme apply: .*: applied (\d+) of (\d+) launches", re.MULTILINE)


def progress(message: str) -> None:
    print(f"[apply_speedup {time.strftime('%H:%M:%S')}] {message}", flush=True)


def build(w: apps.Workload, build_dir: Path, arch: str) -> None:
    proc = subprocess.run(["make", "-B", "-C", str(apps.EXAMPLES), w.folder, f"ARCH={arch}", f"BUILD={build_dir}"],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise apps.StepError(f"building {w.folder} failed: {proc.stderr[-600:]}")


def record(w: apps.Workload, app: list[str], out: Path, timeout_s: float) -> apps.RecordedInstance:
    rec_dir = out / "recordings" / w.name
    cmd = apps.record_command(rec_dir, app, ["--kernel", w.kernel_pattern, "-sr", "2", "-mr", "1"])
    run = apps.run_app(cmd, timeout_s, cwd=out, pass_pattern=w.pass_pattern)
    if not run.passed:
        raise apps.StepError(f"{w.name} did not pass under mneme record: {run.explain()}")
    return apps.find_instance(rec_dir, w.kernel_pattern)


def tune(w: apps.Workload, instance: apps.RecordedInstance, out: Path, trials: int, timeout_s: float) -> Path:
    results = out / "results" / w.name
    cmd = [sys.executable, "-m", "mneme", "tune", "-rdb", instance.database, "-rid", instance.record_id,
           "--space-preset", "standard", "--launch-safety", "aggressive", "--sampler", "tpe", "--trials", str(trials),
           "--seed", "0", "--results-dir", str(results), "--quiet"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=out, env=apps.child_env())
    if proc.returncode != 0:
        raise apps.StepError(f"mneme tune failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-600:]}")
    return results


def applied_run(w: apps.Workload, app: list[str], results: Path, out: Path, timeout_s: float) -> tuple[apps.AppRun, str]:
    cmd = [sys.executable, "-m", "mneme", "run", "--apply", str(results), "--", *app]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=out, env=apps.child_env())
    run = apps.AppRun(wall_s=time.perf_counter() - start, returncode=proc.returncode,
                      verdict=apps.verdict(proc.stdout, w.pass_pattern), kernel_times=apps.parse_kernel_times(proc.stdout),
                      stdout_tail=proc.stdout[-300:], stderr_tail=proc.stderr[-600:])
    return run, proc.stderr


def kernel_us(run: apps.AppRun, kernel: str) -> float:
    times = run.kernel_times.get(kernel) or {}
    if "median_us" not in times:
        raise apps.StepError(f"the application printed no KERNEL_TIME for {kernel}: {run.stdout_tail}")
    return times["median_us"]


def measure(w: apps.Workload, build_dir: Path, out: Path, opts: argparse.Namespace) -> dict[str, Any]:
    app = w.command(build_dir)
    progress(f"{w.name}: recording {w.main_kernel}")
    instance = record(w, app, out, opts.app_timeout)
    progress(f"{w.name}: tuning instance {instance.record_id} ({opts.trials} trials)")
    results = tune(w, instance, out, opts.trials, opts.tune_timeout)
    best = json.loads((results / "best.json").read_text())
    if not best.get("best"):
        raise apps.StepError(f"the tuner found no verified configuration: {best.get('reason')}")
    predicted = best["best"]["speedup"]
    plain_k, applied_k, plain_w, applied_w, counts = [], [], [], [], []
    for r in range(opts.repeats):
        plain = apps.run_app(app, opts.app_timeout, cwd=out, pass_pattern=w.pass_pattern)
        if not plain.passed:
            raise apps.StepError(f"{w.name} did not pass: {plain.explain()}")
        applied, stderr = applied_run(w, app, results, out, opts.app_timeout)
        if not applied.passed:
            raise apps.StepError(f"{w.name} did not pass under mneme run --apply: {applied.explain()}")
        plain_k.append(kernel_us(plain, w.main_kernel))
        applied_k.append(kernel_us(applied, w.main_kernel))
        plain_w.append(plain.wall_s)
        applied_w.append(applied.wall_s)
        counts = [(int(a), int(n)) for a, n in _APPLIED.findall(stderr)]
        progress(f"{w.name} run {r + 1}: kernel {plain_k[-1]:.1f} us plain, {applied_k[-1]:.1f} us applied; "
                 f"launches applied {counts}")
    return {
        "kernel": w.main_kernel,
        "configuration": best["best"]["configuration"],
        "predicted_speedup": predicted,
        "measured_speedup": statistics.median(plain_k) / statistics.median(applied_k),
        "plain_kernel_us": plain_k, "applied_kernel_us": applied_k,
        "plain_wall_s": plain_w, "applied_wall_s": applied_w,
        "applied_launches": counts,
        "check": "PASS / PASS",
    }


def table(rows: dict[str, dict[str, Any]]) -> str:
    head = ("workload", "kernel", "tuned block", "predicted", "measured", "kernel us plain -> applied",
            "wall s plain -> applied", "launches applied", "app check")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for name, r in rows.items():
        if "error" in r:
            lines.append(" | ".join([name, "-", "-", "-", "-", "-", "-", "-", f"error: {r['error']}"]))
            continue
        b = r["configuration"]["block"]
        applied = ", ".join(f"{a}/{n}" for a, n in r["applied_launches"]) or "-"
        lines.append(" | ".join([
            name, r["kernel"], f"{b['x']}x{b['y']}x{b['z']}", f"x{r['predicted_speedup']:.3f}",
            f"x{r['measured_speedup']:.3f}",
            f"{statistics.median(r['plain_kernel_us']):.1f} -> {statistics.median(r['applied_kernel_us']):.1f}",
            f"{statistics.median(r['plain_wall_s']):.2f} -> {statistics.median(r['applied_wall_s']):.2f}",
            applied, r["check"],
        ]))
    return "\n".join("| " + line + " |" for line in lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("/tmp/mneme-apply-speedup"), help="working folder (created)")
    p.add_argument("--arch", help="nvcc -arch (default: the GPU's)")
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    p.add_argument("--repeats", type=int, default=3, help="plain and applied runs, alternating (default 3)")
    p.add_argument("--trials", type=int, default=32, help="tuning trials per kernel (TPE, default 32)")
    p.add_argument("--app-timeout", type=float, default=300.0)
    p.add_argument("--tune-timeout", type=float, default=600.0)
    opts = p.parse_args(argv)
    if opts.repeats < 1 or opts.trials < 1:
        p.error("--repeats and --trials must be at least 1")
    return opts


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    gpu = gpu_description()
    arch = opts.arch or default_arch(gpu)
    out = opts.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    progress(f"GPU: {gpu.get('gpu', 'unknown')} (driver {gpu.get('driver', '?')}), {arch}")
    rows: dict[str, dict[str, Any]] = {}
    for name in opts.workloads:
        w = apps.workload(name)
        try:
            build(w, out / "build", arch)
            rows[name] = measure(w, out / "build", out, opts)
        except (apps.StepError, subprocess.TimeoutExpired) as exc:
            rows[name] = {"error": str(exc)}
            progress(f"{name}: {exc}")
    (out / "apply_speedup.json").write_text(json.dumps({"gpu": gpu, "arch": arch, "rows": rows}, indent=2))
    print(table(rows))
    return 1 if any("error" in r for r in rows.values()) else 0


if __name__ == "__main__":
    from results_file import record_output  # bench/results/NAME.md

    sys.exit(record_output("apply_speedup", main))
