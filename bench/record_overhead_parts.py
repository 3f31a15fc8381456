"""Where the recorder's cost goes when its kernel filter records nothing (issue 3).

`bench/record_overhead.py` measures application wall time with and without the
recorder; this splits the filtered run's extra time into its parts, side by
side in one run (variants interleaved run by run, medians): CUDA's eager module
loading alone; a do-nothing library injected through CUDA_INJECTION64_PATH; the
same library loading CUPTI, subscribing and enabling the callbacks the recorder
enables (module loads, graph launches, texture/surface objects, managed
memory); a do-nothing library preloaded with LD_PRELOAD; the same CUPTI steps
taken from a preloaded library's constructor instead of the injection entry
point; and the recorder itself (all of it, without LD_PRELOAD, without the
injection). The application is a vector add that times itself
(`bench/apps/timed_vecadd.cu`): its first CUDA call (context creation), the
launch loop per launch (host side) and all of main(), beside the process's wall
time, so fixed start-up costs and per-launch costs show apart.

    python bench/record_overhead_parts.py [--shape 4096x20000] [--repeats 25] [--only NAME|NAME...]
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

from mneme._internal.native_libs import cupti_library, recorder_library  # noqa: E402

# A library that does as much of the recorder's CUPTI set-up as PARTS_LEVEL says (0: nothing; 1: dlopen CUPTI;
# 2: + cuptiSubscribe; 3: + the recorder's callbacks), from InitializeInjection or, with PARTS_CTOR, its constructor.
PARTS_LIBRARY = r'''
#include <dlfcn.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
typedef int (*Subscribe)(void**, void*, void*);
typedef int (*Enable)(uint32_t, void*, int, uint32_t);
static void callback(void*, int, uint32_t, const void*) {}
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  int level = std::atoi(std::getenv("PARTS_LEVEL") ? std::getenv("PARTS_LEVEL") : "0");
  if (level == 0) return 1;
  void* cupti = dlopen(std::getenv("MNEME_CUPTI_PATH"), RTLD_NOW | RTLD_GLOBAL);
  if (!cupti) { std::fprintf(stderr, "parts: no CUPTI\n"); return 1; }
  if (level < 2) return 1;
  void* subscriber = nullptr;
  ((Subscribe)dlsym(cupti, "cuptiSubscribe"))(&subscriber, (void*)callback, nullptr);
  if (level < 3) return 1;
  Enable enable = (Enable)dlsym(cupti, "cuptiEnableCallback");
  const uint32_t driver_ids[] = {DRIVER_IDS};
  for (uint32_t id : driver_ids) enable(1, subscriber, 1 /* driver API */, id);
  enable(1, subscriber, 3 /* resource */, 4 /* module loaded */);
  return 1;
}
__attribute__((constructor)) static void at_load() { if (std::getenv("PARTS_CTOR")) InitializeInjection(); }
'''
# The driver API callbacks the recorder enables besides the launches (native/recorder/src/injection.cpp).
RECORDER_DRIVER_CALLBACKS = [
    "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary", "cuLibraryLoadData", "cuGraphLaunch",
    "cuGraphLaunch_ptsz", "cuTexObjectCreate", "cuTexObjectDestroy", "cuSurfObjectCreate", "cuSurfObjectDestroy",
    "cuMemAllocManaged",
]


def callback_ids() -> list[str]:
    headers = [Path(p) / "cupti_driver_cbid.h" for p in ("/usr/local/cuda/include", "/usr/local/cuda/extras/CUPTI/include")]
    header = next((h for h in headers if h.exists()), None)
    if header is None:
        raise SystemExit("cupti_driver_cbid.h not found under /usr/local/cuda: this benchmark needs the CUDA toolkit")
    ids = {}
    for line in header.read_text().splitlines():
        for name in RECORDER_DRIVER_CALLBACKS:
            if f"CUPTI_DRIVER_TRACE_CBID_{name} " in line:
                ids[name] = line.split("=")[1].split(",")[0].strip()
    return [ids[n] for n in RECORDER_DRIVER_CALLBACKS]


def build(tmp: Path) -> tuple[Path, Path]:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    app = tmp / "timed_vecadd"
    subprocess.run([nvcc, "-O3", "-arch=sm_90", "-o", app, ROOT / "bench" / "apps" / "timed_vecadd.cu"], check=True)
    source = tmp / "parts.cpp"
    source.write_text(PARTS_LIBRARY.replace("DRIVER_IDS", ", ".join(callback_ids())))
    library = tmp / "libparts.so"
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-o", library, source, "-ldl"], check=True)
    return app, library


def variants(parts: Path, spool: str) -> dict[str, dict[str, str]]:
    base = dict(os.environ, MNEME_CUPTI_PATH=str(cupti_library() or ""))
    recorder = str(recorder_library())

    def with_recorder(*drop: str) -> dict[str, str]:
        env = dict(base, LD_PRELOAD=recorder, CUDA_INJECTION64_PATH=recorder,  # lazy loading, as mneme record runs
                   MNEME_SPOOL_DIR=spool, MNEME_KERNEL_REGEX="^no_such_kernel$")
        for name in drop:
            env.pop(name)
        return env

    injected = dict(base, CUDA_INJECTION64_PATH=str(parts))
    return {
        "no recorder": dict(base),
        "eager module loading": dict(base, CUDA_MODULE_LOADING="EAGER"),
        "injected library, doing nothing": dict(injected, PARTS_LEVEL="0"),
        "injected library: CUPTI, subscribe, recorder's callbacks": dict(injected, PARTS_LEVEL="3"),
        "preloaded library, doing nothing": dict(base, LD_PRELOAD=str(parts)),
        "preloaded library: the same CUPTI steps in its constructor": dict(base, LD_PRELOAD=str(parts), PARTS_CTOR="1",
                                                                         PARTS_LEVEL="3"),
        "recorder, filter records nothing": with_recorder(),
        "recorder without LD_PRELOAD (no allocation window)": with_recorder("LD_PRELOAD"),
        "recorder without the injection (window only)": with_recorder("CUDA_INJECTION64_PATH"),
        "recorder, filter records nothing, eager loading (--eager-loading)": dict(with_recorder(), CUDA_MODULE_LOADING="EAGER"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="4096x20000", help="NxITERATIONS of the vector add (default: launch-bound)")
    ap.add_argument("--repeats", type=int, default=25, help="runs of each variant, interleaved (default 25)")
    ap.add_argument("--only", help="variant names to run, separated by |")
    args = ap.parse_args()
    n, iterations = args.shape.split("x")
    with tempfile.TemporaryDirectory(prefix="mneme-parts-") as tmp:
        app, parts = build(Path(tmp))
        spool = tempfile.mkdtemp(prefix="spool-", dir=tmp)
        chosen = variants(parts, spool)
        if args.only:
            chosen = {k: v for k, v in chosen.items() if k in args.only.split("|") or k == "no recorder"}
        command = [str(app), n, iterations]
        subprocess.run(command, env=chosen["no recorder"], capture_output=True, check=True)  # warm the driver
        walls: dict[str, list[float]] = {k: [] for k in chosen}
        inside: dict[str, list[dict]] = {k: [] for k in chosen}
        for _ in range(args.repeats):
            for name, env in chosen.items():
                start = time.perf_counter()
                done = subprocess.run(command, env=env, capture_output=True, text=True)
                walls[name].append(time.perf_counter() - start)
                if done.returncode != 0:
                    raise SystemExit(f"{name}: exit {done.returncode}: {done.stderr[-1000:]}")
                inside[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    base = statistics.median(walls["no recorder"])
    print(f"\nvector add n={n} x{iterations}: medians of {args.repeats} runs per variant, interleaved; "
          "inside the application: its first CUDA call, host time per launch, all of main()")
    print(f"| {'variant':58s} | wall [ms] | extra [ms] | extra | IQR [ms] | first CUDA call [ms] | per launch [us] | main() [ms] |")
    print(f"|{'-' * 60}|-----------|------------|-------|----------|----------------------|-----------------|-------------|")
    for name, samples in walls.items():
        wall = statistics.median(samples)
        q1, _, q3 = statistics.quantiles(samples, n=4)
        med = {field: statistics.median(r[field] for r in inside[name]) for field in ("init_ms", "launch_us", "main_ms")}
        print(f"| {name:58s} | {wall * 1e3:9.1f} | {(wall - base) * 1e3:+10.1f} | {100 * (wall / base - 1):+4.1f}% | "
              f"{(q3 - q1) * 1e3:8.1f} | {med['init_ms']:20.1f} | {med['launch_us']:15.3f} | {med['main_ms']:11.1f} |")
    return 0


if __name__ == "__main__":
    from results_file import record_output  # bench/results/NAME.md

    sys.exit(record_output("record_overhead_parts", main))
