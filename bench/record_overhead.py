"""Recording overhead and snapshot throughput of `mneme record` (issue 3).

Measured side by side in one run, on the vector-add example (examples/vecadd):

* application wall time without the recorder, with the recorder injected and a
  kernel filter that records no launch, and with recording on (the recorder
  alone, and the whole `mneme record` command including the agent);
  in a compute-bound shape (large vectors) and a launch-bound one (tiny
  vectors, many launches), medians of runs interleaved variant by variant
  (so drift of the machine hits every variant alike); plus the start-up of
  the `mneme record` command itself (Python, the agent) on a program that
  does not use CUDA;
* snapshot capture: for a multi-GB snapshot (two recorded instances, so the
  second shows the steady state without the one-time staging set-up), what
  the application is stalled for (bytes / capture seconds) beside the
  sustained write rate into the spool (bytes / span of the file writes), for
  several writer-thread counts (= stripe files), into a spool on disk
  ($TMPDIR) and in memory (/dev/shm); and the copy engine alone.

Targets: filter-on overhead <= 2%; snapshot capture >= 10 GB/s.

`--app-scale` times long, memory-heavy programs instead (bench/record_app_scale.py,
issue 19): application and `mneme record` wall times with recording off, on
with the defaults and with -mr 1, and where the recording's time goes.

    python bench/record_overhead.py [--recorder-lib PATH] [--repeats 5] [--launch-repeats 15] [--json OUT]
    python bench/record_overhead.py --app-scale [--cg 230[,ITERATIONS]] [--stencil 1024[,SWEEPS]] [--target-s 22] [--app-repeats 1]
    python bench/record_overhead.py --only-apps [--app-repeats 5]   # PyTorch and Triton programs (bench/record_frameworks.py)

`--only-apps` times Python/ML programs (issue 23): a PyTorch and a Triton program
without recording, with eager module loading alone, and under `mneme record`.

`--fresh` times a short program whose one recorded instance is 1.5 GB of new
data, and the command's own start-up (bench/record_fresh.py): the capture
pipeline's stages in GB/s. `--results FILE` writes its tables (and those of
`--app-scale`) into a markdown result file with the host, GPU, date and commit.

    python bench/record_overhead.py --fresh [--fresh-n 580] [--fresh-repeats 3] [--results bench/results/record_overhead.md]
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # a source checkout is the fallback: an installed mneme (with its native parts) wins

import record_app_scale  # noqa: E402
import record_frameworks  # noqa: E402
import record_fresh  # noqa: E402
from results_file import as_markdown, tee_stdout, write_section  # noqa: E402

from mneme._internal.native_libs import cupti_library, recorder_library  # noqa: E402


def build_vecadd(out: Path) -> Path:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    exe = out / "vecadd"
    subprocess.run([nvcc, "-O3", "-arch=sm_90", "-o", exe, ROOT / "examples" / "vecadd" / "vecadd.cu"], check=True)
    return exe


D2H_PROBE = r"""
// The copy engine's ceiling on this machine: device -> pinned host, no files.
#include <cstdio>
#include <cstdlib>
int main(int argc, char** argv) {
  size_t total = std::strtoull(argv[1], nullptr, 0), chunk = 16u << 20;
  char* d; cudaMalloc(&d, total);
  cudaMemset(d, 1, total);
  char* h; cudaMallocHost(&h, 8 * chunk);
  cudaStream_t s; cudaStreamCreate(&s);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int rep = 0; rep < 2; ++rep) {  // the first pass warms up
    cudaEventRecord(a, s);
    for (size_t off = 0, k = 0; off < total; off += chunk, ++k)
      cudaMemcpyAsync(h + (k % 8) * chunk, d + off, off + chunk <= total ? chunk : total - off, cudaMemcpyDeviceToHost, s);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
  }
  float ms = 0; cudaEventElapsedTime(&ms, a, b);
  std::printf("%f\n", total / (ms * 1e-3) / 1e9);
  return 0;
}
"""


def d2h_ceiling(tmp: Path, nbytes: int) -> float:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    (tmp / "d2h.cu").write_text(D2H_PROBE)
    subprocess.run([nvcc, "-O2", "-o", tmp / "d2h", tmp / "d2h.cu"], check=True)
    out = subprocess.run([str(tmp / "d2h"), str(nbytes)], check=True, capture_output=True, text=True).stdout
    return float(out.strip())


def injected_env(lib: str, spool: str, **settings: str) -> dict[str, str]:
    env = dict(os.environ, LD_PRELOAD=lib, CUDA_INJECTION64_PATH=lib, MNEME_SPOOL_DIR=spool)
    cupti = cupti_library()
    if cupti:
        env["MNEME_CUPTI_PATH"] = str(cupti)
    env.update(settings)
    return env


def wall(cmd: list[str], env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,)) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode not in ok:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return elapsed


def interleaved_medians(makers: list, repeats: int, ok: tuple[int, ...] = (0,)) -> list[float]:
    """Median wall time of each variant, the variants run in turn in every round."""
    samples: list[list[float]] = [[] for _ in makers]
    for _ in range(repeats):
        for i, make in enumerate(makers):
            cmd, env, cleanup = make()
            samples[i].append(wall(cmd, env, ok))
            cleanup()
    return [statistics.median(s) for s in samples]


def overhead_rows(exe: Path, lib: str, shape: tuple[int, int], repeats: int, breakdown: bool = False) -> list[dict]:
    n, iterations = shape
    app = [str(exe), str(n), str(iterations)]

    def plain(**settings):
        def make():
            return app, dict(os.environ, **settings) if settings else None, lambda: None
        return make

    def injected(drop: tuple[str, ...] = (), **settings):
        def make():
            spool = tempfile.mkdtemp(prefix="mneme-bench-spool-")
            env = injected_env(lib, spool, **settings)
            for name in drop:
                env.pop(name, None)
            return app, env, lambda: shutil.rmtree(spool, ignore_errors=True)
        return make

    def full_record(*options):
        def make():
            rdb = tempfile.mkdtemp(prefix="mneme-bench-rdb-")
            path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
            env = dict(os.environ, MNEME_RECORDER_LIB=lib, PYTHONPATH=path)
            cmd = [sys.executable, "-m", "mneme", "record", "-rdb", rdb, *options, "--", *app]
            return cmd, env, lambda: shutil.rmtree(rdb, ignore_errors=True)
        return make

    nothing = "^no_such_kernel$"
    variants = [
        ("no recorder", plain()),
        ("recorder, filter records nothing", injected(MNEME_KERNEL_REGEX=nothing)),
        ("recorder, recording on (1 instance)", injected(MNEME_MAX="1")),
        ("mneme record, filter records nothing", full_record("--kernel", "^no_such_kernel$")),
        ("mneme record, recording on", full_record()),
    ]
    if breakdown:  # where the filtered run's extra time goes: each part of the recorder alone
        variants += [
            ("  part: eager module loading alone (no recorder)", plain(CUDA_MODULE_LOADING="EAGER")),
            ("  part: CUPTI injection alone (filter, no LD_PRELOAD window)",
             injected(drop=("LD_PRELOAD",), MNEME_KERNEL_REGEX=nothing)),
            ("  part: LD_PRELOAD window alone (no CUPTI injection)",
             injected(drop=("CUDA_INJECTION64_PATH",), MNEME_KERNEL_REGEX=nothing)),
        ]
    wall(app)  # warm the driver and the file cache
    times = interleaved_medians([make for _, make in variants], repeats)
    base = times[0]
    return [{"shape": f"n={n} x{iterations}", "variant": name, "wall_s": t, "extra_s": t - base,
             "overhead_pct": 100.0 * (t / base - 1.0)} for (name, _), t in zip(variants, times)]


def cli_startup_row(lib: str, repeats: int) -> dict:
    """`mneme record` around a program without CUDA: the command's own start-up (Python, the agent).

    It exits 2 there (the recorder never started: nothing to record), which is expected.
    """
    true = shutil.which("true") or "/bin/true"

    def plain():
        return [true], None, lambda: None

    def recorded():
        rdb = tempfile.mkdtemp(prefix="mneme-bench-rdb-")
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, MNEME_RECORDER_LIB=lib, PYTHONPATH=path)
        return [sys.executable, "-m", "mneme", "record", "-rdb", rdb, "--", true], env, lambda: shutil.rmtree(rdb, ignore_errors=True)

    t_plain, t_rec = interleaved_medians([plain, recorded], repeats, ok=(0, 2))
    return {"shape": "true (no CUDA)", "variant": "mneme record start-up (Python, agent)", "wall_s": t_rec,
            "extra_s": t_rec - t_plain, "overhead_pct": float("nan")}


def snapshot_rows(exe: Path, lib: str, n: int, parents: list[str], writer_counts: list[int]) -> list[dict]:
    rows = []
    for parent in parents:
        if not os.path.isdir(parent):
            continue
        for writers in writer_counts:
            spool = tempfile.mkdtemp(prefix="mneme-bench-snap-", dir=parent)
            try:
                # Two launches, both recorded: the first pays the one-time staging set-up.
                wall([str(exe), str(n), "2"], injected_env(lib, spool, MNEME_MAX="2", MNEME_VA_SIZE=str(16 << 30),
                                                           MNEME_SPOOL_WRITERS=str(writers), MNEME_RECORD_DUPLICATES="1",
                                                           MNEME_DIGESTS="0"))  # the copy path: every byte
                entries = sorted(p for p in Path(spool, "entries").iterdir() if not p.name.endswith(".tmp"))
                for instance, entry in enumerate(entries, 1):
                    meta = json.loads((entry / "launch.json").read_text())
                    waits = meta.get("prologue_wait_seconds", {})
                    for phase in ("prologue", "epilogue"):
                        nbytes, secs = meta[f"{phase}_bytes"], meta[f"{phase}_seconds"]
                        write_s = meta.get(f"{phase}_write_seconds", float("nan"))
                        pro = phase == "prologue"
                        rows.append({"spool": parent, "writers": str(meta.get("stripes", writers)), "instance": str(instance),
                                     "phase": phase, "bytes": nbytes, "seconds": secs, "gb_per_s": nbytes / secs / 1e9,
                                     "write_gb_per_s": nbytes / write_s / 1e9 if write_s and write_s > 0 else float("nan"),
                                     "setup_s": waits.get("setup", float("nan")) if pro else float("nan"),
                                     "wait_files_s": waits.get("file_writes", float("nan")) if pro else float("nan"),
                                     "wait_copies_s": waits.get("copies", float("nan")) if pro else float("nan")})
            finally:
                shutil.rmtree(spool, ignore_errors=True)
    return rows


def print_table(title: str, rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    print(f"\n{title}")
    widths = [max(len(h), *(len(format(r[k], f)) for r in rows)) for k, h, f in columns]
    print("  ".join(h.ljust(w) for (k, h, f), w in zip(columns, widths)))
    for r in rows:
        print("  ".join(format(r[k], f).ljust(w) for (k, h, f), w in zip(columns, widths)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recorder-lib", help="libmneme_recorder.so (default: MNEME_RECORDER_LIB or the installed one)")
    ap.add_argument("--repeats", type=int, default=5, help="runs per variant of the compute-bound shape")
    ap.add_argument("--launch-repeats", type=int, default=15, help="runs per variant of the launch-bound shape (short, noisy runs)")
    ap.add_argument("--writers", default="4,8,16", help="snapshot writer-thread counts to compare (MNEME_SPOOL_WRITERS)")
    ap.add_argument("--compute-shape", default="16777216x20000", help="NxITERATIONS of the compute-bound run")
    ap.add_argument("--launch-shape", default="4096x20000", help="NxITERATIONS of the launch-bound run")
    ap.add_argument("--snapshot-n", type=int, default=250_000_000, help="vector length of the snapshot run (3 arrays of 4n bytes)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time each part of the recorder alone (eager loading, CUPTI injection, allocation window)")
    ap.add_argument("--skip-snapshots", action="store_true", help="time the application only, not snapshot capture")
    ap.add_argument("--json", help="also write the results here")
    record_app_scale.add_arguments(ap)
    record_frameworks.add_arguments(ap)
    record_fresh.add_arguments(ap)
    args = ap.parse_args()
    if args.fresh:
        return record_fresh.main(args)
    if args.app_scale:
        return record_app_scale.main(args)
    if args.only_apps:
        with tee_stdout() as printed:
            status = record_frameworks.main(args)
        if args.results and status == 0:
            write_section(args.results, "Python and ML frameworks (--only-apps)", as_markdown(printed.getvalue()),
                          heading="Recording cost: measured")
        return status
    lib = args.recorder_lib or str(recorder_library())
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_vecadd(Path(tmp))
        over = []
        for shape, repeats in ((args.compute_shape, args.repeats), (args.launch_shape, args.launch_repeats)):
            n, it = (int(v) for v in shape.split("x"))
            over += overhead_rows(exe, lib, (n, it), repeats, args.breakdown)
        over.append(cli_startup_row(lib, args.repeats))
        writer_counts = [int(w) for w in args.writers.split(",") if w]
        parents = [] if args.skip_snapshots else [tempfile.gettempdir(), "/dev/shm"]
        snaps = snapshot_rows(exe, lib, args.snapshot_n, parents, writer_counts)
        probe_bytes = 4 * args.snapshot_n  # one array's worth
        ceiling = d2h_ceiling(Path(tmp), probe_bytes)
        nan = float("nan")
        snaps.append({"spool": "(none: copy engine only)", "writers": "", "instance": "", "phase": "d2h probe", "bytes": probe_bytes,
                      "seconds": probe_bytes / ceiling / 1e9, "gb_per_s": ceiling, "write_gb_per_s": nan, "setup_s": nan,
                      "wait_files_s": nan, "wait_copies_s": nan})
    with tee_stdout() as printed:
        print_tables(args, over, snaps)
    if args.json:
        Path(args.json).write_text(json.dumps({"overhead": over, "snapshot": snaps}, indent=2))
    if args.results:
        write_section(args.results, "vector add and snapshot capture", as_markdown(printed.getvalue()),
                      heading="Recording cost: measured")
    return 0


def print_tables(args: argparse.Namespace, over: list[dict], snaps: list[dict]) -> None:
    print_table(f"Application wall time (median of {args.repeats} runs, launch-bound shape {args.launch_repeats})", over,
                [("shape", "shape", "s"), ("variant", "variant", "s"), ("wall_s", "wall [s]", ".3f"), ("extra_s", "extra [s]", "+.3f"),
                 ("overhead_pct", "overhead [%]", "+.1f")])
    print_table("Snapshot capture (device -> pinned host -> spool files): the application's stall beside the spool's write rate", snaps,
                [("spool", "spool", "s"), ("writers", "writers", "s"), ("instance", "inst", "s"), ("phase", "phase", "s"), ("bytes", "bytes", "d"),
                 ("seconds", "stalled [s]", ".3f"), ("gb_per_s", "capture GB/s", ".1f"), ("write_gb_per_s", "write GB/s", ".1f"),
                 ("setup_s", "set-up [s]", ".3f"), ("wait_files_s", "waited for writes [s]", ".3f"), ("wait_copies_s", "waited for copies [s]", ".3f")])


if __name__ == "__main__":
    sys.exit(main())
