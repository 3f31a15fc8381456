"""The headline's workloads as applications: build them, run them, record them.

Everything here drives subprocesses (make, the example programs, ``mneme
record``), so a crash or hang in an application costs that step only. The
example programs print ``KERNEL_TIME kernel=NAME ... median_us=...`` for their
main kernel and a ``PASS`` / ``FAIL: reason`` verdict (examples/common/
example_util.h); these are parsed here.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"

_KERNEL_TIME = re.compile(r"^KERNEL_TIME kernel=(?P<kernel>\S+)(?P<fields>(?: \w+=\S+)*)\s*$", re.MULTILINE)


# The status an example exits with when it cannot run here (the CuPy one without CuPy).
SKIP_EXIT_STATUS = 77


class StepError(Exception):
    """A benchmark step failed; the message says what to look at."""


class StepSkipped(StepError):
    """A step cannot run on this machine (the CuPy example without CuPy): reported, not a failure."""


@dataclass(frozen=True)
class Workload:
    """One example application and the kernel the headline studies in it."""

    name: str
    folder: str  # under examples/
    argv: tuple[str, ...]  # relative to the build folder; "{python}" and "{example}" are expanded
    main_kernel: str  # the KERNEL_TIME name
    kernel_pattern: str  # regex matched against the recording database's kernel name
    # a line that means the program checked its result and it was right
    pass_pattern: str = r"^PASS$"

    def command(self, build_dir: Path) -> list[str]:
        out = []
        for part in self.argv:
            if part == "{python}":
                out.append(sys.executable)
            elif part.startswith("{example}/"):
                out.append(str(EXAMPLES / self.folder / part[len("{example}/") :]))
            elif part.startswith("./"):
                built = build_dir / self.folder / part[2:]
                # an example whose Makefile ignores BUILD leaves its program beside its sources
                in_tree = EXAMPLES / self.folder / part[2:]
                out.append(str(built if built.exists() or not in_tree.exists() else in_tree))
            else:
                out.append(part)
        return out


WORKLOADS: tuple[Workload, ...] = (
    # The recorder's vector add, sized like the reference's launch (40000 blocks of 256);
    # it prints "vecadd n=... iterations=...: ok (...)" when its host check passes.
    Workload("vecadd", "vecadd", ("./vecadd", "10240000", "1"), "vecadd", r"vecadd",
             pass_pattern=r"^vecadd n=\d+ iterations=\d+: ok\b"),
    Workload("minife_cg", "minife_cg", ("./cg",), "spmv_csr", r"spmv_csr"),
    Workload("stencil3d", "stencil3d", ("./stencil",), "jacobi7", r"jacobi7"),
    Workload("matmul_tiled", "matmul_tiled", ("./matmul",), "matmul_tiled", r"matmul_tiled"),
    Workload("cupy_nvrtc", "cupy_nvrtc", ("{python}", "{example}/cupy_kernels.py"), "row_softmax", r"row_softmax"),
)


def workload(name: str) -> Workload:
    for w in WORKLOADS:
        if w.name == name:
            return w
    raise StepError(f"no workload named {name!r}; known: {', '.join(w.name for w in WORKLOADS)}")


@functools.lru_cache(maxsize=1)
def mneme_root() -> Path:
    """The folder holding the ``mneme`` package this interpreter imports (installed or this tree)."""
    spec = importlib.util.find_spec("mneme")
    if spec is not None and spec.origin:
        return Path(spec.origin).resolve().parents[1]
    return REPO


def child_env() -> dict[str, str]:
    """The environment for child processes: they import the same mneme as this process.

    Children run in the output folder, so a relative or missing PYTHONPATH
    would make them find no mneme, or another one.
    """
    env = dict(os.environ)
    parts = [str(mneme_root())] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(str(Path(p).resolve()) for p in parts))
    return env


# -- parsing the examples' output ----------------------------------------------------------------


def parse_kernel_times(stdout: str) -> dict[str, dict[str, float]]:
    """Every ``KERNEL_TIME`` line: kernel name -> {launches, mean_us, median_us, min_us}."""
    out: dict[str, dict[str, float]] = {}
    for match in _KERNEL_TIME.finditer(stdout):
        fields = {}
        for item in match.group("fields").split():
            key, _, value = item.partition("=")
            try:
                fields[key] = float(value)
            except ValueError:
                continue
        out[match.group("kernel")] = fields
    return out


def verdict(stdout: str, pass_pattern: str = r"^PASS$") -> str | None:
    """``PASS`` (a line matches ``pass_pattern``), the ``FAIL: reason`` line, or None."""
    lines = stdout.splitlines()
    if any(re.search(pass_pattern, line) for line in lines):
        return "PASS"
    for line in reversed(lines):
        if line.startswith("FAIL"):
            return line
    return None


# -- build -----------------------------------------------------------------------------------------


def vecadd_available() -> bool:
    return (EXAMPLES / "vecadd" / "Makefile").is_file()


def build_examples(build_dir: Path, arch: str, log: Path, nvcc: str | None = None) -> None:
    """``make -C examples`` out of tree; raises StepError with the log's tail on failure.

    ``nvcc`` replaces the compiler (e.g. mneme's LLVM-tier wrapper).
    """
    if shutil.which("nvcc") is None:
        raise StepError("nvcc is not on PATH; install the CUDA toolkit or put its bin/ on PATH")
    build_dir.mkdir(parents=True, exist_ok=True)
    cmd = ["make", "-B", "-C", str(EXAMPLES), f"ARCH={arch}", f"BUILD={build_dir}", "-j4"]
    if nvcc:
        cmd.append(f"NVCC={nvcc}")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise StepError(f"building the examples failed (log: {log}): {_tail(proc.stderr or proc.stdout)}")


# -- running and recording -------------------------------------------------------------------------


@dataclass
class AppRun:
    """One run of an application: wall time, verdict and the kernel times it printed."""

    wall_s: float
    returncode: int
    verdict: str | None
    kernel_times: dict[str, dict[str, float]] = field(default_factory=dict)
    stdout_tail: str = ""
    stderr_tail: str = ""

    @property
    def passed(self) -> bool:
        return self.returncode == 0 and self.verdict == "PASS"

    def explain(self) -> str:
        return (
            f"exit status {self.returncode}, verdict {self.verdict!r}; stderr: {self.stderr_tail or '-'}; "
            f"stdout: {self.stdout_tail or '-'}"
        )


def run_app(cmd: Sequence[str], timeout_s: float, cwd: Path, pass_pattern: str = r"^PASS$") -> AppRun:
    """Run ``cmd`` to completion, timing its wall clock from start to exit."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s, cwd=cwd,
                              env=child_env())
    except subprocess.TimeoutExpired:
        raise StepError(f"{' '.join(cmd)} ran past {timeout_s:.0f} s and was killed") from None
    except OSError as exc:
        raise StepError(f"cannot start {cmd[0]}: {exc}") from None
    wall = time.perf_counter() - start
    return AppRun(
        wall_s=wall,
        returncode=proc.returncode,
        verdict=verdict(proc.stdout, pass_pattern),
        kernel_times=parse_kernel_times(proc.stdout),
        stdout_tail=_tail(proc.stdout),
        stderr_tail=_tail(proc.stderr),
    )


def record_command(record_dir: Path, app: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    """``mneme record -rdb DIR [extra] -- app...`` through this interpreter."""
    return [sys.executable, "-m", "mneme", "record", "-rdb", str(record_dir), *extra, "--", *app]


@dataclass
class OverheadMeasurement:
    """Application wall time with and without recording (medians over the repeats)."""

    plain_s: list[float]
    recorded_s: list[float]
    kernel_times: dict[str, dict[str, float]]
    record_dir: str
    record_bytes: int = 0

    @property
    def plain_median_s(self) -> float:
        return statistics.median(self.plain_s)

    @property
    def recorded_median_s(self) -> float:
        return statistics.median(self.recorded_s)

    @property
    def overhead_ratio(self) -> float:
        return self.recorded_median_s / self.plain_median_s

    def to_dict(self) -> dict:
        return {
            "plain_s": self.plain_s,
            "recorded_s": self.recorded_s,
            "plain_median_s": self.plain_median_s,
            "recorded_median_s": self.recorded_median_s,
            "overhead_ratio": self.overhead_ratio,
            "app_kernel_times": self.kernel_times,
            "record_dir": self.record_dir,
            "record_bytes": self.record_bytes,
        }


def measure_recording(w: Workload, build_dir: Path, out_dir: Path, repeats: int, timeout_s: float,
                      record_args: Sequence[str] = ()) -> OverheadMeasurement:
    """Run the application ``repeats`` times plain and ``repeats`` times under ``mneme record``.

    Runs alternate (plain, recorded, plain, ...) so that drift in clocks or
    temperature affects both sides alike. Each recorded run writes a fresh
    directory; the last one is kept for the replay stages. A run that does not
    print PASS is an error: a recording of a broken run is worth nothing.
    """
    app = w.command(build_dir)
    plain, recorded = [], []
    kernel_times: dict[str, dict[str, float]] = {}
    record_dir = out_dir / "recordings" / w.name
    for _ in range(repeats):
        run = run_app(app, timeout_s, cwd=out_dir, pass_pattern=w.pass_pattern)
        if run.returncode == SKIP_EXIT_STATUS:
            raise StepSkipped(run.stderr_tail or "the example reported a skip")
        if not run.passed:
            raise StepError(f"{w.name} did not pass without recording: {run.explain()}")
        plain.append(run.wall_s)
        kernel_times = run.kernel_times
        if record_dir.exists():
            shutil.rmtree(record_dir)
        run = run_app(record_command(record_dir, app, record_args), timeout_s, cwd=out_dir,
                      pass_pattern=w.pass_pattern)
        if not run.passed:
            raise StepError(f"{w.name} did not pass under mneme record: {run.explain()}")
        recorded.append(run.wall_s)
    return OverheadMeasurement(plain, recorded, kernel_times, str(record_dir), directory_bytes(record_dir))


def directory_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (what a recording costs on disk)."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


# -- finding the recording of the main kernel ------------------------------------------------------


@dataclass(frozen=True)
class RecordedInstance:
    """The database file and instance id of the kernel a stage replays."""

    database: str
    record_id: str
    kernel_name: str
    grid: dict
    block: dict
    shared_mem: int
    app_kernel_time_ns: int | None
    has_bitcode: bool


def find_instance(record_dir: Path, kernel_pattern: str) -> RecordedInstance:
    """The last-launched instance of the kernel matching ``kernel_pattern`` in ``record_dir``.

    The last launch is the steady state of iterative programs (the CG solver's
    first SpMV multiplies the zero vector; later ones the search direction).
    """
    pattern = re.compile(kernel_pattern)
    seen = []
    for path in sorted(Path(record_dir).rglob("*.json")):
        try:
            db = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(db, dict) or "instances" not in db:
            continue  # not a recording database
        kernel = db.get("kernel") or {}
        names = [str(kernel.get("name", "")), str(kernel.get("demangled", ""))]
        seen.append(names[1] or names[0])
        if not any(pattern.search(n) for n in names if n):
            continue
        instances = db.get("instances") or {}
        if not instances:
            raise StepError(f"{path} records {names[0]} but holds no instance")
        rid, inst = max(instances.items(), key=lambda item: (item[1].get("launch_index", 0), item[0]))
        return RecordedInstance(
            database=str(path),
            record_id=rid,
            kernel_name=names[1] or names[0],
            grid=inst.get("grid", {}),
            block=inst.get("block", {}),
            shared_mem=int(inst.get("shared_mem", 0)),
            app_kernel_time_ns=inst.get("app_kernel_time_ns"),
            has_bitcode=bool((db.get("code") or {}).get("bitcode")),
        )
    raise StepError(
        f"no recording of a kernel matching /{kernel_pattern}/ in {record_dir} "
        f"(kernels recorded: {', '.join(seen) or 'none'})"
    )


def _tail(text: str, limit: int = 300) -> str:
    text = " | ".join(line for line in (text or "").strip().splitlines()[-4:] if line.strip())
    return text if len(text) <= limit else "..." + text[-limit:]
