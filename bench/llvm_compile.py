"""LLVM tier benchmark: IR-to-cubin compile time per pipeline, and what tuning finds on a GPU.

    python bench/llvm_compile.py [--repeats 5] [--json-out FILE] [--no-gpu]

Part 1 (CPU only, runs anywhere with llvmlite and ptxas): for every kernel of
tests/mneme/llvm/data/vecops.records and of the examples, the median time of each
compile phase per pipeline: preprocess (parse, internalize, prune), the
``passes`` pipeline, NVPTX code generation, and ptxas to a cubin. One table,
all pipelines measured side by side in one run. The examples' IR is made with
clang where it is installed (and saved to --examples-records); elsewhere that
file is read (carry it from a machine with clang).

Part 2 (only where a GPU is usable): the examples vecadd, minife_cg, stencil3d
and matmul_tiled are built with their kernels' bitcode embedded, the
instrumented build: through the c++ wrapper (``mneme config cxx``) where clang
is installed, else with nvcc and then the records of part 1 embedded by the
code the wrapper uses. Each is recorded with ``mneme record`` and its main
kernel replayed with ``mneme.replay.Replayer`` under every ``passes`` x
``codegen_opt`` x block size; every configuration is verified against the
recorded epilogue. The fastest few verified configurations and the recorded
launch (the application's own nvcc-built kernel, run unchanged) are then
measured again with more launches, and the best of those is set against the
recorded launch. Prints one table, one row per example.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # a source checkout is the fallback: an installed mneme (with its native parts) wins
sys.path.insert(0, str(REPO / "bench"))

PIPELINES = ["default<O0>", "default<O1>", "default<O2>", "default<O3>", "default<Os>", "default<Oz>",
             "sroa,instcombine,simplifycfg"]
CODEGEN_OPTS = [0, 1, 2, 3, 4]
BLOCK_SIZES = [64, 128, 256, 512, 1024]  # 1-D kernels: blockDim.x
BLOCK_SHAPES_3D = [(32, 2, 1), (32, 4, 1), (64, 2, 2), (32, 4, 4), (64, 4, 2), (32, 8, 4)]  # 64..1024 threads
TILES = [8, 16, 32]  # matmul_tiled: t x t blocks
# example workload (bench/headline_apps.py) -> (kernel pattern, arguments after the workload's own, launch shapes)
GPU_WORKLOADS = {
    "vecadd": ("vecadd", [], "x"),  # the workload's 10240000 elements, 1 launch
    "minife_cg": ("spmv_csr", ["64", "6"], "x"),  # 64^3 grid, 6 CG iterations
    "stencil3d": ("jacobi7", ["128", "3"], "xyz"),  # 128^3 points, 3 sweeps
    "matmul_tiled": ("matmul_tiled", ["1024", "16"], "tile"),  # n = 1024, 16 x 16 tiles
}
IR_ARCH = "sm_90"  # what clang builds the examples' IR for (the replay retargets it)
DEFAULT_RECORDS = REPO / "build" / "llvm-bench" / "examples.records"
WRAPPER = REPO / "mneme" / "toolchain" / "bin" / "mneme-c++"


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
    failures: dict[str, int]  # status (or "compile_error") -> configurations, of those that did not verify

    @property
    def speedup(self) -> float:
        return self.baseline_us / self.best_us if self.best_us > 0 else float("nan")


# -- part 1: compile time ------------------------------------------------------------------------


def example_records(records_file: Path) -> tuple[list, str]:
    """The examples' kernel records and where they came from.

    Built with clang from examples/*/*.cu where clang is installed (and saved to
    ``records_file``), else read from ``records_file`` when it exists.
    """
    from mneme.llvm.section import BitcodeRecord, decode_records, encode_records
    from mneme.toolchain import device_ir

    reason = clang_reason()
    if reason is not None:
        if records_file.is_file():
            return decode_records(records_file.read_bytes()), f"read from {records_file} (no clang here)"
        return [], f"none: no clang here ({reason}) and no {records_file}"
    records = []
    for source in sorted((REPO / "examples").glob("*/*.cu")):
        rel = source.relative_to(REPO).as_posix()
        try:
            for r in device_ir.device_records(str(source), IR_ARCH, [f"-I{REPO / 'examples/common'}"]):
                records.append(BitcodeRecord(r.kernels, r.bitcode, rel, r.arch, r.producer))
        except Exception as exc:
            print(f"(example {rel}: no IR: {exc})")
    records_file.parent.mkdir(parents=True, exist_ok=True)
    records_file.write_bytes(encode_records(records))
    return records, f"built with clang from examples/ (saved to {records_file})"


def kernel_bitcode(examples: list) -> dict[str, bytes]:
    """Kernels to compile: vecops (committed records) and the examples' records."""
    from mneme.llvm.section import decode_records

    out = {r.kernels[0]: r.bitcode for r in decode_records((REPO / "tests/mneme/llvm/data/vecops.records").read_bytes())}
    out.update((r.kernels[0], r.bitcode) for r in examples)
    return out


def measure_compiles(repeats: int, arch: str, kernels: dict[str, bytes]) -> list[CompileRow]:
    from mneme.llvm import compile_to_ptx_timed
    from mneme.replay.compile import find_ptxas

    ptxas = find_ptxas()
    rows = []
    with tempfile.TemporaryDirectory(prefix="mneme-bench-") as tmp:
        ptx_path, cubin = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
        for kernel, bitcode in kernels.items():
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
    from mneme.testing.gpu import gpu_unavailable_reason

    return gpu_unavailable_reason()


def clang_reason() -> str | None:
    """None where the instrumented build can make IR (clang and the LLVM tools), else why not."""
    from mneme.toolchain import device_ir

    try:
        device_ir.find_tools()
    except Exception as exc:
        return str(exc)
    return None


def build_instrumented(build: Path, arch: str, records: list, log: Path) -> str:
    """Build the examples with their kernels' bitcode embedded; says how.

    Where clang is installed: through the c++ wrapper (``mneme config cxx``).
    Elsewhere: nvcc, then the records of part 1 embedded into each program by
    the code the wrapper uses (the same ``.mneme_bitcode`` section).
    """
    import headline_apps as apps

    from mneme.toolchain.embed import embed_records

    if clang_reason() is None:
        apps.build_examples(build, arch, log, nvcc=str(WRAPPER))
        return "through the c++ wrapper (mneme config cxx)"
    if not records:
        raise apps.StepError(
            f"no clang here ({clang_reason()}) and no example records: run this benchmark once where clang is "
            f"installed (it writes {DEFAULT_RECORDS.relative_to(REPO)}) and carry that file here"
        )
    apps.build_examples(build, arch, log)
    for name in GPU_WORKLOADS:
        w = apps.workload(name)
        mine = [r for r in records if Path(r.source).parent.name == w.folder]
        if not mine:
            raise apps.StepError(f"the example records hold no kernel of examples/{w.folder}")
        embed_records(w.command(build)[0], mine)
    return "with nvcc, then the examples' records (made with clang) embedded as the wrapper does"


def launch_shapes(rule: str, base) -> list[tuple[tuple[int, int, int], int]]:
    """(block, dynamic shared memory) candidates; the grid is recomputed to cover the recorded work."""
    if rule == "x":  # 1-D kernels
        return [((b, 1, 1), base.shared_mem) for b in BLOCK_SIZES]
    if rule == "xyz":  # 3-D kernels
        return [(shape, base.shared_mem) for shape in BLOCK_SHAPES_3D]
    if rule == "tile":  # a t x t block stages 2*t*t floats (examples/matmul_tiled/matmul.cu)
        per_thread = base.shared_mem // base.block.count
        return [((t, t, 1), per_thread * t * t) for t in TILES]
    raise ValueError(f"unknown launch-shape rule {rule!r}")


def _median_us(result) -> float:
    return statistics.median(result.measured_times) / 1e3


def describe(config, base) -> str:
    """``passes, codegen_opt, block`` of a configuration; nvcc's own code where passes is the baseline's."""
    from mneme.model.experiment import DEFAULT_PASSES

    code = "nvcc PTX" if config.passes == DEFAULT_PASSES else config.passes
    shape = "x".join(str(v) for v in config.block.as_tuple() if v > 1) or "1"
    recorded = " (recorded)" if config.block == base.block else ""
    return f"{code}, codegen_opt={config.codegen_opt}, block {shape}{recorded}"


def _compile(replayer, config):
    try:
        return replayer.compile(config)
    except Exception as exc:  # counted as not verified, like the replay would report it
        return exc


def record_example(name: str, build_dir: Path, work: Path):
    """``mneme record`` of the example; its main kernel's recorded instance."""
    import headline_apps as apps

    pattern, args, _ = GPU_WORKLOADS[name]
    rdb = work / f"rdb-{name}"
    proc = subprocess.run(apps.record_command(rdb, [*apps.workload(name).command(build_dir), *args]),
                          capture_output=True, text=True, env=apps.child_env(), cwd=work, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"mneme record {name} failed: {(proc.stderr or proc.stdout)[-400:]}")
    instance = apps.find_instance(rdb, pattern)
    if not instance.has_bitcode:
        raise RuntimeError(f"{name}: the recording has no bitcode (the build embedded none for this kernel)")
    return instance


def tune_workload(name: str, build_dir: Path, work: Path, iterations: int, confirm: int, top: int) -> TuneRow:
    from mneme.model.experiment import Dim3
    from mneme.recording.execution import RecordedExecution
    from mneme.replay import Replayer
    from tuner.space.launch_shapes import covering_grid

    instance = record_example(name, build_dir, work)
    recording = RecordedExecution.from_json(instance.database)
    with Replayer(recording, instance.record_id) as replayer:
        base = replayer.baseline()
        total = Dim3(*(g * b for g, b in zip(base.grid.as_tuple(), base.block.as_tuple())))
        variants = [base.replace(passes=p, codegen_opt=o) for p in PIPELINES for o in CODEGEN_OPTS]
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:  # CPU work, in parallel
            codes = list(pool.map(lambda c: _compile(replayer, c), variants))
        sweep = []  # (median us, configuration, code) of every verified configuration
        tried, failures = 0, Counter()
        for variant, code in zip(variants, codes):
            for block, shared in launch_shapes(GPU_WORKLOADS[name][2], base):
                shape = Dim3(*block)
                config = variant.replace(block=shape, grid=covering_grid(total, shape), shared_mem=shared)
                tried += 1
                if isinstance(code, Exception):
                    failures["compile_error"] += 1
                    continue
                result = replayer.run(config, iterations=iterations, warmup=2, compiled=code)
                if not replayer.healthy:
                    raise RuntimeError(f"{name}: {describe(config, base)} destroyed the CUDA context: {result.error}")
                if result.verified:
                    sweep.append((_median_us(result), config, code))
                else:
                    failures[f"{result.status} ({'nvcc PTX' if code.tier != 'llvm' else 'LLVM tier'})"] += 1
        # The recorded launch and the sweep's fastest few, measured again with more launches.
        baseline = replayer.run(base, iterations=confirm, warmup=2)
        if not baseline.verified:
            raise RuntimeError(f"{name}: the recorded launch does not verify: {baseline.status} {baseline.error}")
        baseline_us = best_us = _median_us(baseline)
        best = "recorded launch (nvcc)"
        for _, config, code in sorted(sweep, key=lambda item: item[0])[:top]:
            result = replayer.run(config, iterations=confirm, warmup=2, compiled=code)
            if result.verified and _median_us(result) < best_us:
                best_us, best = _median_us(result), describe(config, base)
    return TuneRow(name, instance.kernel_name, baseline_us, best_us, best, tried, len(sweep), dict(failures))


def run_gpu_part(records: list, iterations: int, confirm: int, top: int) -> tuple[list[TuneRow], str]:
    import headline_apps as apps
    from headline import default_arch, gpu_description

    rows = []
    with tempfile.TemporaryDirectory(prefix="mneme-llvm-bench-") as tmp:
        work = Path(tmp)
        build = work / "build"
        arch = default_arch(gpu_description())
        try:
            how = build_instrumented(build, arch, records, work / "build.log")
        except apps.StepError as exc:
            return [], f"not run: {exc}"
        for name in GPU_WORKLOADS:
            start = time.perf_counter()
            try:
                rows.append(tune_workload(name, build, work, iterations, confirm, top))
                print(f"({name}: tuned in {time.perf_counter() - start:.0f} s)", flush=True)
            except Exception as exc:
                print(f"{name}: skipped ({exc})", flush=True)
    return rows, f"examples built for {arch} {how}"


def print_tune_table(rows: list[TuneRow], how: str, iterations: int, confirm: int, top: int) -> None:
    print(f"\nBest verified speedup over the nvcc-built kernel, tuning passes x codegen_opt x block size ({how})")
    print(f"sweep: {iterations} timed launches per configuration; the recorded launch and the sweep's fastest {top} "
          f"then re-timed with {confirm} launches (medians)")
    header = (f"{'example':<13} {'kernel':<14} {'nvcc us':>9} {'best us':>9} {'speedup':>8} {'verified':>9}  "
              "best configuration")
    print(header)
    print("-" * (len(header) + 40))
    for r in rows:
        kernel = r.kernel.replace("(anonymous namespace)::", "").split("(")[0]
        print(f"{r.workload:<13} {kernel[:14]:<14} {r.baseline_us:9.2f} {r.best_us:9.2f} {r.speedup:7.2f}x "
              f"{r.verified:>4}/{r.tried:<4}  {r.best_config}")
    for r in rows:
        if r.failures:
            print(f"{r.workload}: not verified: " + ", ".join(f"{n} {what}" for what, n in sorted(r.failures.items())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="compiles per kernel and pipeline (median)")
    parser.add_argument("--arch", default="sm_90", help="target of the CPU compile-time part")
    parser.add_argument("--iterations", type=int, default=5, help="timed launches per configuration (GPU sweep)")
    parser.add_argument("--confirm-iterations", type=int, default=20,
                        help="timed launches re-measuring the recorded launch and the sweep's fastest")
    parser.add_argument("--top", type=int, default=3, help="how many of the sweep's fastest to re-measure")
    parser.add_argument("--examples-records", type=Path, default=DEFAULT_RECORDS,
                        help="the examples' kernel records: written where clang is, read where it is not")
    parser.add_argument("--no-gpu", action="store_true", help="only the compile-time part")
    parser.add_argument("--json-out", type=Path, help="also write the rows as JSON")
    args = parser.parse_args(argv)

    examples, origin = example_records(args.examples_records)
    print(f"examples' IR: {origin}")
    compile_rows = measure_compiles(args.repeats, args.arch, kernel_bitcode(examples))
    print_compile_table(compile_rows, args.repeats)
    tune_rows: list[TuneRow] = []
    reason = "--no-gpu" if args.no_gpu else gpu_reason()
    if reason is None:
        tune_rows, how = run_gpu_part(examples, args.iterations, args.confirm_iterations, args.top)
        print_tune_table(tune_rows, how, args.iterations, args.confirm_iterations, args.top)
    else:
        print(f"\n(tuning part skipped: {reason})")
    if args.json_out:
        args.json_out.write_text(json.dumps({
            "compile": [asdict(r) | {"total_ms": r.total_ms} for r in compile_rows],
            "tune": [asdict(r) | {"speedup": r.speedup} for r in tune_rows],
        }, indent=2))
    return 0


if __name__ == "__main__":
    from results_file import record_output  # bench/results/NAME.md

    sys.exit(record_output("llvm_compile", main))
