"""Recording overhead and snapshot throughput of `mneme record` (issue 3).

Measured side by side in one run, on the vector-add example (examples/vecadd):

* application wall time without the recorder, with the recorder injected and a
  kernel filter that records no launch, and with recording on (the recorder
  alone, and the whole `mneme record` command including the agent);
  in a compute-bound shape (large vectors) and a launch-bound one (tiny
  vectors, many launches), medians of --repeats runs;
* snapshot capture throughput: device-to-host bytes per second of the
  prologue/epilogue capture (pinned staging buffers, copies overlapped with
  the file writes) for a multi-GB snapshot, into a spool on disk ($TMPDIR)
  and in memory (/dev/shm).

Targets: filter-on overhead <= 2%; snapshot capture >= 10 GB/s.

    python bench/record_overhead.py [--recorder-lib PATH] [--repeats 5] [--json OUT]
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

from record_agent.locate import cupti_library, recorder_library  # noqa: E402


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
    env = dict(os.environ, LD_PRELOAD=lib, CUDA_INJECTION64_PATH=lib, CUDA_MODULE_LOADING="EAGER", MNEME_SPOOL_DIR=spool)
    cupti = cupti_library()
    if cupti:
        env["MNEME_CUPTI_PATH"] = str(cupti)
    env.update(settings)
    return env


def wall(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return elapsed


def median_wall(make, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        cmd, env, cleanup = make()
        samples.append(wall(cmd, env))
        cleanup()
    return statistics.median(samples)


def overhead_rows(exe: Path, lib: str, shape: tuple[int, int], repeats: int) -> list[dict]:
    n, iterations = shape
    app = [str(exe), str(n), str(iterations)]

    def plain():
        return app, None, lambda: None

    def injected(**settings):
        def make():
            spool = tempfile.mkdtemp(prefix="mneme-bench-spool-")
            return app, injected_env(lib, spool, **settings), lambda: shutil.rmtree(spool, ignore_errors=True)
        return make

    def full_record(*options):
        def make():
            rdb = tempfile.mkdtemp(prefix="mneme-bench-rdb-")
            path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
            env = dict(os.environ, MNEME_RECORDER_LIB=lib, PYTHONPATH=path)
            cmd = [sys.executable, "-m", "mneme", "record", "-rdb", rdb, *options, "--", *app]
            return cmd, env, lambda: shutil.rmtree(rdb, ignore_errors=True)
        return make

    variants = [
        ("no recorder", plain),
        ("recorder, filter records nothing", injected(MNEME_KERNEL_REGEX="^no_such_kernel$")),
        ("recorder, recording on (1 instance)", injected(MNEME_MAX="1")),
        ("mneme record, filter records nothing", full_record("--kernel", "^no_such_kernel$")),
        ("mneme record, recording on", full_record()),
    ]
    wall(app)  # warm the driver and the file cache
    base = None
    rows = []
    for name, make in variants:
        t = median_wall(make, repeats)
        base = t if base is None else base
        rows.append({"shape": f"n={n} x{iterations}", "variant": name, "wall_s": t, "extra_s": t - base,
                     "overhead_pct": 100.0 * (t / base - 1.0)})
    return rows


def snapshot_rows(exe: Path, lib: str, n: int, parents: list[str]) -> list[dict]:
    rows = []
    for parent in parents:
        if not os.path.isdir(parent):
            continue
        spool = tempfile.mkdtemp(prefix="mneme-bench-snap-", dir=parent)
        try:
            wall([str(exe), str(n), "1"], injected_env(lib, spool, MNEME_MAX="1", MNEME_VA_SIZE=str(16 << 30)))
            (entry,) = [p for p in Path(spool, "entries").iterdir() if not p.name.endswith(".tmp")]
            meta = json.loads((entry / "launch.json").read_text())
            waits = meta.get("prologue_wait_seconds", {})
            for phase in ("prologue", "epilogue"):
                nbytes, secs = meta[f"{phase}_bytes"], meta[f"{phase}_seconds"]
                rows.append({"spool": parent, "phase": phase, "bytes": nbytes, "seconds": secs, "gb_per_s": nbytes / secs / 1e9,
                             "wait_files_s": waits.get("file_writes", float("nan")) if phase == "prologue" else float("nan"),
                             "wait_copies_s": waits.get("copies", float("nan")) if phase == "prologue" else float("nan")})
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
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compute-shape", default="16777216x20000", help="NxITERATIONS of the compute-bound run")
    ap.add_argument("--launch-shape", default="4096x20000", help="NxITERATIONS of the launch-bound run")
    ap.add_argument("--snapshot-n", type=int, default=250_000_000, help="vector length of the snapshot run (3 arrays of 4n bytes)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    lib = args.recorder_lib or str(recorder_library())
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_vecadd(Path(tmp))
        over = []
        for shape in (args.compute_shape, args.launch_shape):
            n, it = (int(v) for v in shape.split("x"))
            over += overhead_rows(exe, lib, (n, it), args.repeats)
        snaps = snapshot_rows(exe, lib, args.snapshot_n, [tempfile.gettempdir(), "/dev/shm"])
        probe_bytes = 4 * args.snapshot_n  # one array's worth
        ceiling = d2h_ceiling(Path(tmp), probe_bytes)
        snaps.append({"spool": "(none: copy engine only)", "phase": "d2h probe", "bytes": probe_bytes,
                      "seconds": probe_bytes / ceiling / 1e9, "gb_per_s": ceiling,
                      "wait_files_s": float("nan"), "wait_copies_s": float("nan")})
    print_table("Application wall time (median of %d runs)" % args.repeats, over,
                [("shape", "shape", "s"), ("variant", "variant", "s"), ("wall_s", "wall [s]", ".3f"), ("extra_s", "extra [s]", "+.3f"),
                 ("overhead_pct", "overhead [%]", "+.1f")])
    print_table("Snapshot capture (device -> pinned host -> spool file)", snaps,
                [("spool", "spool", "s"), ("phase", "phase", "s"), ("bytes", "bytes", "d"), ("seconds", "seconds", ".3f"), ("gb_per_s", "GB/s", ".1f"),
                 ("wait_files_s", "waited for writes [s]", ".3f"), ("wait_copies_s", "waited for copies [s]", ".3f")])
    if args.json:
        Path(args.json).write_text(json.dumps({"overhead": over, "snapshot": snaps}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
