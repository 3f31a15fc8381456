"""LLVM tier benchmark: IR-to-cubin compile time per pipeline, and what tuning finds on a GPU.

    PYTHONPATH=. python bench/llvm_compile.py [--repeats 5] [--json-out FILE] [--no-gpu]

Part 1 (CPU only, runs anywhere with llvmlite and ptxas): for every kernel of
tests/llvm/data/vecops.records, and of the examples when clang can build their
IR, the median time of each compile phase per pipeline: preprocess (parse,
internalize, prune), the ``passes`` pipeline, NVPTX code generation, and ptxas
to a cubin. One table, all pipelines measured side by side in one run.

Part 2 (only where a GPU is usable): the examples are built through the c++
wrapper (so they carry their bitcode), recorded with ``mneme record``, and
their main kernel is tuned exhaustively over ``passes`` x ``codegen_opt`` x
block size with ``mneme.replay.Replayer``. Every configuration is verified
against the recorded epilogue; the best verified one is set against the
application's own nvcc-built kernel (the recorded cubin, replayed in the same
process just before). Prints a table of speedups.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # a source checkout is the fallback: an installed mneme (with its native parts) wins
sys.path.insert(0, str(REPO / "bench"))

PIPELINES = ["default<O0>", "default<O1>", "default<O2>", "default<O3>", "default<Os>", "default<Oz>",
             "sroa,instcombine,simplifycfg"]
CODEGEN_OPTS = [0, 1, 2, 3, 4]
BLOCK_SIZES = [64, 128, 256, 512, 1024]
# example workload (bench/headline_apps.py) -> (kernel pattern, arguments after the workload's own)
GPU_WORKLOADS = {
    "vecadd": ("vecadd", []),  # the workload's 10240000 elements, 1 launch
    "stencil3d": ("jacobi7", ["128", "3"]),  # 128^3 points, 3 sweeps
    "matmul_tiled": ("matmul_tiled", ["1024", "16"]),  # n = 1024, 16 x 16 tiles
    "minife_cg": ("spmv_csr", ["64", "6"]),  # 64^3 grid, 6 CG iterations
}


@dataclass
class CompileRow:
    kernel: str
    pipeline: str
    preprocess_ms: float
    opt_ms: float
    codegen_ms: float
    ptxas_ms: float
    ptx_lines: int

    @property
    def total_ms(self) -> float:
        return self.preprocess_ms + self.opt_ms + self.codegen_ms + self.ptxas_ms


@dataclass
class TuneRow:
    workload: str
    kernel: str
    baseline_us: float
    best_us: float
    best_config: str
    tried: int
    verified: int

    @property
    def speedup(self) -> float:
        return self.baseline_us / self.best_us if self.best_us > 0 else float("nan")


# -- part 1: compile time ------------------------------------------------------------------------


def kernel_bitcode() -> dict[str, bytes]:
    """Kernels to compile: vecops (committed records) plus the examples when clang is here."""
    from mneme.llvm.section import decode_records

    out = {r.kernels[0]: r.bitcode for r in decode_records((REPO / "tests/llvm/data/vecops.records").read_bytes())}
    try:
        from mneme.toolchain import device_ir

        device_ir.find_tools()
    except Exception as exc:  # no clang: vecops only
        print(f"(examples skipped in part 1: {exc})")
        return out
    for source in sorted((REPO / "examples").glob("*/*.cu")):
        try:
            for record in device_ir.device_records(str(source), "sm_90", [f"-I{REPO / 'examples/common'}"]):
                out[record.kernels[0]] = record.bitcode
        except Exception as exc:
            print(f"(example {source.name} skipped: {exc})")
    return out


def measure_compiles(repeats: int, arch: str) -> list[CompileRow]:
    from mneme.llvm import compile_to_ptx_timed
    from mneme.replay.compile import find_ptxas

    ptxas = find_ptxas()
    rows = []
    with tempfile.TemporaryDirectory(prefix="mneme-bench-") as tmp:
        ptx_path, cubin = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
        for kernel, bitcode in kernel_bitcode().items():
            compile_to_ptx_timed(bitcode, kernel=kernel, arch=arch)  # warm caches (target machine, imports)
            for passes in PIPELINES:
                phases: dict[str, list[float]] = {"pre": [], "opt": [], "cg": [], "ptxas": []}
                ptx = ""
                for _ in range(repeats):
                    ptx, t = compile_to_ptx_timed(bitcode, kernel=kernel, passes=passes, arch=arch)
                    ptx_path.write_text(ptx)
                    t0 = time.perf_counter()
                    subprocess.run([ptxas, f"-arch={arch}", "-O3", str(ptx_path), "-o", str(cubin)], check=True)
                    phases["ptxas"].append(time.perf_counter() - t0)
                    phases["pre"].append(t.preprocess_ir_time)
                    phases["opt"].append(t.opt_time)
                    phases["cg"].append(t.codegen_time)
                med = {k: statistics.median(v) * 1e3 for k, v in phases.items()}
                rows.append(CompileRow(kernel, passes, med["pre"], med["opt"], med["cg"], med["ptxas"],
                                       ptx.count("\n")))
    return rows


def print_compile_table(rows: list[CompileRow], repeats: int) -> None:
    print(f"\nIR-to-cubin compile time per pipeline (median of {repeats}, ms)")
    header = f"{'kernel':<34} {'pipeline':<28} {'preproc':>8} {'opt':>8} {'codegen':>8} {'ptxas':>8} {'total':>8} {'PTX lines':>9}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.kernel[:34]:<34} {r.pipeline:<28} {r.preprocess_ms:8.2f} {r.opt_ms:8.2f} {r.codegen_ms:8.2f} "
              f"{r.ptxas_ms:8.2f} {r.total_ms:8.2f} {r.ptx_lines:9d}")
    by_pipeline: dict[str, list[float]] = {}
    for r in rows:
        by_pipeline.setdefault(r.pipeline, []).append(r.total_ms)
    print("\nmean total per pipeline: " + ", ".join(f"{p} {statistics.mean(v):.1f} ms" for p, v in by_pipeline.items()))


# -- part 2: tuning on a GPU -------------------------------------------------------------------------


def gpu_reason() -> str | None:
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import gpu_unavailable_reason

    return gpu_unavailable_reason()


def _median_us(result) -> float:
    return statistics.median(result.measured_times) / 1e3


def tune_workload(name: str, build_dir: Path, work: Path, iterations: int) -> TuneRow:
    import headline_apps as apps

    from mneme.recorded_execution import RecordedExecution
    from mneme.replay import Replayer

    pattern, args = GPU_WORKLOADS[name]
    w = apps.workload(name)
    rdb = work / f"rdb-{name}"
    proc = subprocess.run(apps.record_command(rdb, [*w.command(build_dir), *args]), capture_output=True, text=True,
                          env=apps.child_env(), cwd=work, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"mneme record {name} failed: {proc.stderr[-400:]}")
    instance = apps.find_instance(rdb, pattern)
    if not instance.has_bitcode:
        raise RuntimeError(f"{name}: the recording has no bitcode (was it built through the wrapper?)")
    recording = RecordedExecution.from_json(instance.database)
    with Replayer(recording, instance.record_id) as replayer:
        base = replayer.baseline()
        baseline = replayer.run(base, iterations=iterations, warmup=2)
        if not baseline.verified:
            raise RuntimeError(f"{name}: the recorded baseline does not verify: {baseline.status} {baseline.error}")
        threads = base.grid.x * base.block.x
        best_us, best, tried, verified = _median_us(baseline), "baseline (nvcc)", 0, 0
        baseline_us = best_us
        for passes in PIPELINES:
            for opt in CODEGEN_OPTS:
                for block in BLOCK_SIZES:
                    if block * base.block.y * base.block.z > 1024:
                        continue
                    grid = max(1, math.ceil(threads / block))
                    config = base.replace(passes=passes, codegen_opt=opt, block={"x": block, "y": base.block.y,
                                          "z": base.block.z}, grid={"x": grid, "y": base.grid.y, "z": base.grid.z})
                    tried += 1
                    result = replayer.run(config, iterations=iterations, warmup=2)
                    if not result.verified:
                        continue
                    verified += 1
                    if _median_us(result) < best_us:
                        best_us, best = _median_us(result), f"{passes} O{opt} block={block}"
                    if not replayer.healthy:
                        raise RuntimeError(f"{name}: a configuration destroyed the CUDA context ({result.error})")
    return TuneRow(name, instance.kernel_name, baseline_us, best_us, best, tried, verified)


def run_gpu_part(iterations: int) -> list[TuneRow]:
    import headline_apps as apps

    rows = []
    with tempfile.TemporaryDirectory(prefix="mneme-llvm-bench-") as tmp:
        work = Path(tmp)
        build = work / "build"
        wrapper = REPO / "mneme" / "toolchain" / "bin" / "mneme-c++"
        apps.build_examples(build, "native", work / "build.log", nvcc=str(wrapper))
        for name in GPU_WORKLOADS:
            try:
                rows.append(tune_workload(name, build, work, iterations))
            except Exception as exc:
                print(f"{name}: skipped ({exc})")
    return rows


def print_tune_table(rows: list[TuneRow]) -> None:
    print("\nBest speedup over the nvcc-built kernel: passes x codegen_opt x block size, all verified")
    header = f"{'workload':<14} {'kernel':<24} {'nvcc us':>9} {'best us':>9} {'speedup':>8} {'tried':>6} {'verified':>8}  best configuration"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.workload:<14} {r.kernel[:24]:<24} {r.baseline_us:9.2f} {r.best_us:9.2f} {r.speedup:7.2f}x "
              f"{r.tried:6d} {r.verified:8d}  {r.best_config}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="compiles per kernel and pipeline (median)")
    parser.add_argument("--arch", default="sm_90", help="target of the CPU compile-time part")
    parser.add_argument("--iterations", type=int, default=5, help="timed launches per configuration (GPU part)")
    parser.add_argument("--no-gpu", action="store_true", help="only the compile-time part")
    parser.add_argument("--json-out", type=Path, help="also write the rows as JSON")
    args = parser.parse_args(argv)

    compile_rows = measure_compiles(args.repeats, args.arch)
    print_compile_table(compile_rows, args.repeats)
    tune_rows: list[TuneRow] = []
    reason = "--no-gpu" if args.no_gpu else gpu_reason()
    if reason is None:
        tune_rows = run_gpu_part(args.iterations)
        print_tune_table(tune_rows)
    else:
        print(f"\n(tuning part skipped: {reason})")
    if args.json_out:
        args.json_out.write_text(json.dumps({
            "compile": [asdict(r) | {"total_ms": r.total_ms} for r in compile_rows],
            "tune": [asdict(r) | {"speedup": r.speedup} for r in tune_rows],
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
