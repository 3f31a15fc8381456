"""PTX-to-cubin latency: ptxas in a subprocess against nvPTXCompiler in-process (mneme._ptxcompiler).

    python bench/ptx_compile_latency.py [--repeats 20] [--arch sm_90] [--json-out FILE]

The replay servers' compile pools turn the PTX of every compile variant
(``codegen_opt`` 0..4) into a cubin before its first configuration can run; a
cold sweep of the vector-add space lasts ~50-100 ms, so each compile's
latency weighs. For the vector-add PTX and a bigger module (the CG solver of
``examples/minife_cg``, made with ``nvcc -ptx`` where nvcc is installed), and
each variant's ptxas options (``mneme.replay.compile.ptxas_flags``), this
measures side by side in one run, alternating which goes first: the ptxas
program as ``CompileCache`` runs it (``run_ptxas``: PTX to a temporary file,
one subprocess) and the library (``PtxLibrary``), first call and median of
``--repeats``, their ratio, and whether both gave the same code (every ELF
section but ``.note.nv.tkinfo``, which names the build). The last rows per
kernel compile all variants at once on 4 threads, the compile pool's default
size (the library releases the GIL; ptxas runs as processes).

A fresh process's first library compile pays the library's initialization:
measured apart, in a new interpreter, and printed under the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # a source checkout is the fallback: an installed mneme (with its native parts) wins

CODEGEN_OPTS = [0, 1, 2, 3, 4]
POOL = 4  # the compile pool's default size: min(4, CPUs)


@dataclass
class Row:
    kernel: str
    variant: str
    ptxas_first_ms: float
    ptxas_median_ms: float
    library_first_ms: float
    library_median_ms: float
    same_code: bool | None
    ratio: float = field(init=False)

    def __post_init__(self) -> None:
        self.ratio = self.ptxas_median_ms / self.library_median_ms if self.library_median_ms else float("nan")


def cg_ptx(arch: str) -> tuple[str | None, str]:
    """The CG solver example's PTX (nvcc -ptx), or None and why not."""
    source = REPO / "examples" / "minife_cg" / "cg.cu"
    with tempfile.TemporaryDirectory(prefix="mneme-bench-ptx-") as tmp:
        out = Path(tmp) / "cg.ptx"
        cmd = ["nvcc", "-ptx", f"-arch={arch}", "-O3", f"-I{REPO / 'examples' / 'common'}", "-o", str(out), str(source)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"nvcc: {exc}"
        if proc.returncode != 0:
            return None, f"nvcc failed: {proc.stderr.strip()[-300:]}"
        return out.read_text(), f"{source.relative_to(REPO)} (nvcc -ptx -O3)"


def same_code(a: bytes, b: bytes) -> bool:
    from mneme.llvm.elf import read_section, section_names

    names = section_names(a)
    if names != section_names(b):
        return False
    return all(read_section(a, n) == read_section(b, n) for n in names if n != ".note.nv.tkinfo")


def timed(fn, *args) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    image, _log = fn(*args)
    return (time.perf_counter() - t0) * 1e3, image


def measure(kernel: str, ptx: str, arch: str, repeats: int, ptxas, library) -> list[Row]:
    from mneme.replay.compile import ptxas_flags

    rows = []
    variants = {opt: ptxas_flags(opt, arch) for opt in CODEGEN_OPTS}
    times: dict[tuple[int, str], list[float]] = {(opt, who): [] for opt in variants for who in ("ptxas", "library")}
    same: dict[int, bool] = {}
    for r in range(repeats):
        for opt, flags in variants.items():
            order = [("ptxas", ptxas), ("library", library)]
            if (r + opt) % 2:
                order.reverse()  # neither always goes first (page cache, CPU caches)
            images = {}
            for who, compiler in order:
                ms, images[who] = timed(compiler.compile, ptx, flags)
                times[(opt, who)].append(ms)
            if r == 0:
                same[opt] = same_code(images["ptxas"], images["library"])
    for opt, flags in variants.items():
        p, lib = times[(opt, "ptxas")], times[(opt, "library")]
        rows.append(Row(kernel, f"{opt}: {' '.join(flags[1:])}", p[0], statistics.median(p[1:] or p),
                        lib[0], statistics.median(lib[1:] or lib), same[opt]))  # fmt: skip
    # All variants at once on POOL threads: the wall time until the last cubin.
    batch = {"ptxas": [], "library": []}
    with ThreadPoolExecutor(POOL) as pool:
        for r in range(max(repeats // 2, 3)):
            for who, compiler in ([("ptxas", ptxas), ("library", library)][:: 1 if r % 2 else -1]):
                t0 = time.perf_counter()
                list(pool.map(lambda flags: compiler.compile(ptx, flags), variants.values()))
                batch[who].append((time.perf_counter() - t0) * 1e3)
    rows.append(Row(kernel, f"all {len(variants)} on {POOL} threads at once", batch["ptxas"][0],
                    statistics.median(batch["ptxas"][1:]), batch["library"][0],
                    statistics.median(batch["library"][1:]), None))  # fmt: skip
    return rows


FRESH_PROCESS = """
import sys, time
t0 = time.perf_counter()
from mneme import _ptxcompiler
t1 = time.perf_counter()
_ptxcompiler.compile(sys.stdin.read(), ["--gpu-name=" + sys.argv[1], "-O3"])
t2 = time.perf_counter()
print((t1 - t0) * 1e3, (t2 - t1) * 1e3)
"""


def fresh_process(ptx: str, arch: str) -> str:
    """A new interpreter's import of the module and first compile (the library's one-time initialization)."""
    proc = subprocess.run([sys.executable, "-c", FRESH_PROCESS, arch], input=ptx, capture_output=True, text=True,
                          cwd=tempfile.gettempdir(), timeout=120)  # fmt: skip
    if proc.returncode != 0:
        return f"fresh process failed: {proc.stderr.strip()[-300:]}"
    import_ms, first_ms = (float(x) for x in proc.stdout.split())
    return f"a fresh process: import mneme._ptxcompiler {import_ms:.1f} ms, first compile (vecadd -O3) {first_ms:.1f} ms"


def print_table(rows: list[Row], repeats: int) -> None:
    print(f"\nPTX to cubin, ptxas subprocess vs nvPTXCompiler in-process (ms; median of {repeats - 1} after the first)")
    header = (f"{'kernel':<10} {'codegen_opt: ptxas options':<44} {'ptxas 1st':>9} {'ptxas med':>9} {'lib 1st':>8} {'lib med':>8} "
              f"{'ptxas/lib':>9} {'same code':>9}")  # fmt: skip
    print(header)
    print("-" * len(header))
    for r in rows:
        same = "-" if r.same_code is None else ("yes" if r.same_code else "NO")
        print(f"{r.kernel:<10} {r.variant:<44} {r.ptxas_first_ms:9.2f} {r.ptxas_median_ms:9.2f} "
              f"{r.library_first_ms:8.2f} {r.library_median_ms:8.2f} {r.ratio:8.2f}x {same:>9}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="compiles per kernel, variant and compiler")
    parser.add_argument("--arch", default="sm_90", help="the GPU architecture compiled for")
    parser.add_argument("--json-out", type=Path, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    if args.repeats < 2:
        parser.error("--repeats must be at least 2 (the first call is reported apart)")

    from mneme.replay import compile as cmp
    from mneme.testing import vecadd_code

    library = cmp._library()
    if isinstance(library, str):
        print(f"ptx_compile_latency: nothing to compare: {library} (this build found no libnvptxcompiler_static.a)")
        return 1
    ptxas = cmp.PtxasProgram(cmp.find_ptxas())
    print(f"library: {library.identity}\nptxas:   {ptxas.path} ({ptxas.identity})")
    print(fresh_process(vecadd_code.PTX, args.arch))

    kernels = [("vecadd", vecadd_code.PTX)]
    ptx, origin = cg_ptx(args.arch)
    if ptx is None:
        print(f"(CG solver skipped: {origin})")
    else:
        print(f"minife_cg: {origin}, {len(ptx.splitlines())} PTX lines")
        kernels.append(("minife_cg", ptx))
    rows = [row for name, source in kernels for row in measure(name, source, args.arch, args.repeats, ptxas, library)]
    print_table(rows, args.repeats)
    if args.json_out:
        args.json_out.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 0 if all(r.same_code is not False for r in rows) else 1


if __name__ == "__main__":
    from results_file import record_output  # bench/results/NAME.md

    sys.exit(record_output("ptx_compile_latency", main))
