"""The headline benchmark: mneme's full loop on real workloads, on one GPU.

    python bench/headline.py --out DIR

builds the examples (examples/Makefile), then for each workload:

1. recording overhead: the application's wall time without and with
   ``mneme record -rdb DIR -- ./app`` (medians over ``--repeats`` alternating runs);
2. replay fidelity: the recorded baseline replayed with ``mneme.replay.Replayer``
   against the kernel time the application printed (CUDA events around every
   launch) and the one the recorder stored (``app_kernel_time_ns``);

and then the tuning throughput (verified configurations per second through
``AsyncReplayExecutor``) on the reference's vector-add space and on the CG
solver's SpMV kernel, with the best speedup found. The reference's published
figures stand beside ours. Results go to DIR/headline.json, DIR/headline.png
(when matplotlib is installed) and DIR/headline.md, and the table is printed.

Each stage runs in its own process with a time limit: a stage that fails shows
its error in the table and the others still run.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import headline_apps as apps  # noqa: E402
import headline_report as report  # noqa: E402

STAGES_SCRIPT = Path(__file__).resolve().parent / "headline_stages.py"
# Which recorded workload each tuning measurement uses, and its space.
TUNING = {"vecadd": "reference_vecadd", "minife_cg": "spmv"}


def progress(message: str) -> None:
    print(f"[headline {time.strftime('%H:%M:%S')}] {message}", flush=True)


def gpu_description() -> dict[str, str]:
    """GPU name, driver and compute capability from nvidia-smi (empty where unknown)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        ).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if not out:
        return {}
    parts = [p.strip() for p in out[0].split(",")]
    return dict(zip(("gpu", "driver", "compute_cap"), parts))


def default_arch(gpu: dict[str, str]) -> str:
    cap = gpu.get("compute_cap", "")
    return "sm_" + cap.replace(".", "") if cap.replace(".", "").isdigit() else "sm_90"


def git_commit() -> str:
    """The checkout's commit ($MNEME_COMMIT first: a copied tree's .git can lag behind its files)."""
    if os.environ.get("MNEME_COMMIT"):
        return os.environ["MNEME_COMMIT"]
    try:
        return subprocess.run(["git", "-C", str(apps.REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def run_stage(stage: str, out_dir: Path, tag: str, timeout_s: float, args: Sequence[str]) -> dict[str, Any]:
    """Run one GPU stage in a child process; its JSON, or ``{"error": ...}``."""
    json_out = out_dir / "stages" / f"{stage}-{tag}.json"
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.unlink(missing_ok=True)
    log = out_dir / "stages" / f"{stage}-{tag}.log"
    cmd = [sys.executable, str(STAGES_SCRIPT), stage, "--json-out", str(json_out), *args]
    try:
        with log.open("w") as log_file:
            proc = subprocess.run(cmd, stdout=log_file, stderr=subprocess.STDOUT, timeout=timeout_s, cwd=out_dir,
                                  env=apps.child_env())
    except subprocess.TimeoutExpired:
        return {"error": f"ran past {timeout_s:.0f} s and was killed (log: {log})"}
    if json_out.is_file():
        try:
            return json.loads(json_out.read_text())
        except ValueError:
            pass
    tail = apps._tail(log.read_text(errors="replace")) if log.is_file() else ""
    return {"error": f"the stage process ended with status {proc.returncode} and no result: {tail} (log: {log})"}


def measure_fidelity(w: apps.Workload, instance: apps.RecordedInstance, app_times: dict, out_dir: Path,
                     opts: argparse.Namespace) -> dict[str, Any]:
    result = run_stage("fidelity", out_dir, w.name, opts.stage_timeout, [
        "--database", instance.database, "--record-id", instance.record_id,
        "--iterations", str(opts.fidelity_iterations), "--warmup", str(opts.fidelity_warmup),
    ])
    if "error" in result:
        return result
    app_median = app_times.get(w.main_kernel, {}).get("median_us")
    recorder_us = instance.app_kernel_time_ns / 1000.0 if instance.app_kernel_time_ns else None
    replay_median = result.get("replay", {}).get("median_us")
    # The application's own CUDA-event median where it prints one, else the recorder's in-app time.
    in_app = app_median or recorder_us
    result.update({
        "record_id": instance.record_id,
        "database": instance.database,
        "replay_median_us": replay_median,
        "app_median_us": app_median,
        "recorder_app_kernel_time_us": recorder_us,
        "ratio": replay_median / in_app if replay_median and in_app else None,
        "ratio_basis": "application CUDA events" if app_median else ("recorder app_kernel_time_ns" if recorder_us
                                                                     else None),
    })
    result.pop("result", None)  # the full ExperimentResult stays in the stage's own JSON
    return result


def measure_tuning(name: str, instance: apps.RecordedInstance, out_dir: Path, opts: argparse.Namespace):
    return run_stage("tune", out_dir, name, opts.stage_timeout, [
        "--database", instance.database, "--record-id", instance.record_id, "--space", TUNING[name],
        *(["--has-bitcode"] if instance.has_bitcode else []),
        "--iterations", str(opts.tune_iterations), "--warmup", str(opts.tune_warmup),
        "--workers", str(opts.workers), "--results-dir", str(out_dir / "tune-results" / name),
        "--min-configs", str(opts.tune_min_configs),
    ])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="mneme's headline benchmark: record, replay and tune real workloads.")
    p.add_argument("--out", required=True, type=Path, help="folder for the results (created)")
    p.add_argument("--arch", help="nvcc -arch for the examples (default: the GPU's, else sm_90)")
    p.add_argument("--workloads", nargs="+", choices=[w.name for w in apps.WORKLOADS],
                   default=[w.name for w in apps.WORKLOADS], help="which workloads (default: all)")
    p.add_argument("--repeats", type=int, default=3, help="runs with and without recording (default 3)")
    p.add_argument("--fidelity-iterations", type=int, default=20)
    p.add_argument("--fidelity-warmup", type=int, default=3)
    p.add_argument("--tune-iterations", type=int, default=5, help="as the reference: 5 (+ 2 warm-ups)")
    p.add_argument("--tune-warmup", type=int, default=2)
    p.add_argument("--workers", type=int, default=1, help="replay workers on the GPU (the reference used 1)")
    p.add_argument("--tune-min-configs", type=int, default=1000,
                   help="the tuning rate's sweep: the space repeated to at least this many configurations "
                        "(default 1000: a single sweep of 80 lasts a fraction of a second, where fixed "
                        "latencies and noise weigh)")
    p.add_argument("--app-timeout", type=float, default=300.0, help="seconds per application run")
    p.add_argument("--stage-timeout", type=float, default=600.0, help="seconds per replay or tuning stage")
    p.add_argument("--skip-build", action="store_true", help="reuse DIR/build from an earlier run")
    p.add_argument("--nvcc", help='compiler for the examples, e.g. "$(mneme config cxx)" for the LLVM tier')
    opts = p.parse_args(argv)
    if opts.repeats < 1:
        p.error("--repeats must be at least 1")
    return opts


def new_results(opts: argparse.Namespace, gpu: dict[str, str], arch: str) -> dict[str, Any]:
    return {
        "meta": {
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "gpu": gpu.get("gpu", "unknown (nvidia-smi not available)"),
            "driver": gpu.get("driver", ""),
            "arch": arch,
            "host": platform.node(),
            "python": platform.python_version(),
            "commit": git_commit(),
            "options": {k: str(v) for k, v in vars(opts).items()},
        },
        "reference": report.REFERENCE,
        "build": {},
        "workloads": {},
        "tuning": {},
    }


def build(results: dict[str, Any], build_dir: Path, arch: str, out_dir: Path, opts: argparse.Namespace) -> None:
    progress(f"GPU: {results['meta']['gpu']}; building the examples for {arch} into {build_dir}")
    if opts.skip_build:
        results["build"] = {"skipped": True}
        return
    try:
        apps.build_examples(build_dir, arch, out_dir / "build.log", opts.nvcc)
        results["build"] = {"ok": True}
    except (apps.StepError, subprocess.TimeoutExpired) as exc:
        results["build"] = {"error": str(exc)}
        progress(f"build failed: {exc}")


def record_and_replay(w: apps.Workload, build_dir: Path, out_dir: Path, opts: argparse.Namespace,
                      entry: dict[str, Any]) -> apps.RecordedInstance | None:
    """Fill ``entry`` with the recording and fidelity measurements; the recorded instance, if any."""
    no_recording = {"error": "no recording (see the recording row)"}
    if w.name == "vecadd" and not apps.vecadd_available():
        entry.update(recording={"error": "examples/vecadd is not in this tree"}, fidelity=no_recording)
        return None
    progress(f"{w.name}: {opts.repeats} runs without and with mneme record")
    try:
        measured = apps.measure_recording(w, build_dir, out_dir, opts.repeats, opts.app_timeout)
        entry["recording"] = measured.to_dict()
        progress(f"{w.name}: {measured.plain_median_s:.2f} s -> {measured.recorded_median_s:.2f} s recorded")
        instance = apps.find_instance(Path(measured.record_dir), w.kernel_pattern)
    except apps.StepSkipped as exc:
        entry.update(recording={"skipped": str(exc)}, fidelity={"skipped": "no recording"})
        progress(f"{w.name}: skipped: {exc}")
        return None
    except Exception as exc:  # StepError, or a surprise: either way this workload's row says it
        message = str(exc) if isinstance(exc, apps.StepError) else f"{type(exc).__name__}: {exc}"
        entry.setdefault("recording", {"error": message})
        if "error" not in entry["recording"]:
            entry["recording"]["error_finding_instance"] = message
        entry["fidelity"] = no_recording if "error" in entry["recording"] else {"error": message}
        progress(f"{w.name}: {message}")
        return None
    progress(f"{w.name}: replaying {instance.kernel_name} instance {instance.record_id}")
    entry["fidelity"] = measure_fidelity(w, instance, measured.kernel_times, out_dir, opts)
    fid = entry["fidelity"]
    progress(f"{w.name}: " + (f"replay failed: {fid['error']}" if "error" in fid else report.fidelity_text(fid)))
    return instance


def failed_stages(results: dict[str, Any]) -> list[str]:
    """Stages that ended in an error (skips, such as CuPy missing, are not failures)."""
    failed = []
    stages = [("build", results.get("build", {}))]
    for name, entry in results.get("workloads", {}).items():
        stages += [(f"{name} {k}", v) for k, v in entry.items()]
    stages += [(f"tuning {k}", v) for k, v in results.get("tuning", {}).items()]
    for label, stage in stages:
        error = str(stage.get("error", ""))
        if error and not error.startswith("no recording"):  # a consequence, counted where it began
            failed.append(label)
    return failed


def write_outputs(results: dict[str, Any], out_dir: Path) -> str:
    """headline.json, headline.png (or why not), headline.md; returns the printed report."""
    table = report.format_table(report.table_rows(results))
    try:
        chart_note = report.write_chart(results, out_dir / "headline.png")
    except Exception as exc:  # a plotting problem must not lose the measurements
        chart_note = f"the chart failed: {type(exc).__name__}: {exc}"
    results["chart"] = {"path": None, "note": chart_note} if chart_note else {"path": str(out_dir / "headline.png")}
    report.write_json(results, out_dir / "headline.json")
    meta = results["meta"]
    header = f"mneme headline, {meta['date']}, {meta['gpu']} (driver {meta['driver'] or '?'}, commit {meta['commit']})"
    (out_dir / "headline.md").write_text(f"{header}\n\n{table}\n")
    return "\n".join([
        "", header, table, "",
        f"results: {out_dir / 'headline.json'}",
        f"chart:   {chart_note or out_dir / 'headline.png'}",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    """Run every stage; exit 0 when all measured (skips allowed), 1 when some failed (the table says which)."""
    opts = parse_args(argv)
    out_dir: Path = opts.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = gpu_description()
    arch = opts.arch or default_arch(gpu)
    results = new_results(opts, gpu, arch)
    build_dir = out_dir / "build"
    build(results, build_dir, arch, out_dir, opts)

    instances: dict[str, apps.RecordedInstance] = {}
    for name in opts.workloads:
        entry: dict[str, Any] = results["workloads"].setdefault(name, {})
        instance = record_and_replay(apps.workload(name), build_dir, out_dir, opts, entry)
        if instance is not None:
            instances[name] = instance

    for name in (n for n in TUNING if n in opts.workloads):
        if name not in instances:
            results["tuning"][name] = {"error": "no recording (see the workload's recording row)"}
            continue
        progress(f"tuning {name} ({TUNING[name]} space, {opts.workers} worker(s))")
        t = results["tuning"][name] = measure_tuning(name, instances[name], out_dir, opts)
        progress(f"tuning {name}: " + (t["error"] if "error" in t else
                                       f"{t['verified']}/{t['configurations']} verified in {t['sweep_s']:.2f} s"))

    print(write_outputs(results, out_dir))
    failed = failed_stages(results)
    if failed:
        print(f"{len(failed)} stage(s) failed: {', '.join(failed)} (details in headline.json and stages/)")
    return 1 if failed else 0


if __name__ == "__main__":
    from results_file import record_output  # bench/results/NAME.md

    sys.exit(record_output("headline", main))
