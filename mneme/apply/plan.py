"""The apply plan: for each tuned kernel, what the apply library matches and what it launches instead.

``build_plan`` turns tuning results into entries: the kernel's name and the
FNV-1a hash of its recorded module cubin (the loaded code must be that code),
the recorded launch shape (what a launch must have to be replaced), the tuned
shape, and the tuned code, compiled here once, before the application starts
(a cubin for the recording's GPU; none when only the launch shape changed).
``ApplyPlan.write`` writes the line format ``native/apply/src/plan.cpp``
reads. The matching rules are in docs/apply.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from mneme.apply.results import TunedKernel
from mneme.errors import ConfigurationError
from mneme.format.database import POINTER_SIZE
from mneme.model.experiment import Dim3

APPLY_TO = ("exact", "similar")
PLAN_HEADER = "mneme-apply-plan 1"


@dataclass(frozen=True)
class ApplyOptions:
    """``--apply-to``, ``--apply-verify N``, ``--apply-force``."""

    apply_to: str = "exact"
    verify: int = 0
    force: bool = False

    def __post_init__(self) -> None:
        if self.apply_to not in APPLY_TO:
            raise ConfigurationError(f"--apply-to {self.apply_to!r}: choose one of {', '.join(APPLY_TO)}")
        if self.verify < 0:
            raise ConfigurationError(f"--apply-verify {self.verify}: give a count of launches, 0 or more")


@dataclass(frozen=True)
class Shape:
    grid: Dim3
    block: Dim3
    shared_mem: int

    def line(self) -> str:
        return " ".join(str(v) for v in (*self.grid.as_tuple(), *self.block.as_tuple(), self.shared_mem))


@dataclass(frozen=True)
class PlanEntry:
    """One tuned kernel as the apply library sees it."""

    kernel_name: str
    static_hash: str
    cubin_fnv: int
    recorded: Shape
    tuned: Shape
    code_path: Path | None  # None: the application's own code with the tuned shape
    tier: str  # "recorded" (launch shape only), "ptx" or "llvm"
    similar: bool
    pointers: tuple[tuple[int, int], ...]  # (parameter index, byte offset inside it)
    fixed: tuple[tuple[int, bytes], ...]  # (parameter index, value the tuned code was specialized on)
    predicted_speedup: float | None
    results_dir: Path
    compute_capability: tuple[int, int] = (0, 0)  # the recording's GPU, which the tuned code is built for

    def lines(self) -> list[str]:
        out = [
            f"kernel {self.kernel_name}",
            f"static {self.static_hash}",
            f"cubin_fnv {self.cubin_fnv:016x}",
            f"recorded {self.recorded.line()}",
            f"tuned {self.tuned.line()}",
            f"code {self.code_path if self.code_path else '-'}",
            f"similar {int(self.similar)}",
        ]
        if self.pointers:
            out.append("pointers " + " ".join(f"{i}:{o}" for i, o in self.pointers))
        out += [f"fixed {i} {value.hex()}" for i, value in self.fixed]
        return out


@dataclass
class ApplyPlan:
    options: ApplyOptions
    compute_capability: tuple[int, int]
    driver_version: int | None
    entries: list[PlanEntry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # results left out, and why

    def write(self, path: Path) -> Path:
        lines = [PLAN_HEADER, f"verify {self.options.verify}", f"force {int(self.options.force)}",
                 f"device {self.compute_capability[0]} {self.compute_capability[1]} {self.driver_version or 0}"]
        for entry in self.entries:
            lines += entry.lines()
        path.write_text("\n".join(lines) + "\n")
        return path


def driver_name(version: int) -> str:
    """``cuDriverGetVersion``'s 12080 as ``12.8``."""
    return f"{version // 1000}.{version % 1000 // 10}"


@dataclass(frozen=True)
class DriverCheck:
    """Whether results tuned under one CUDA driver are applied under this machine's, and the note saying so."""

    applies: bool
    note: str = ""


def check_driver(tuned: int | None, here: int | None, force: bool) -> DriverCheck:
    """The driver rule of docs/apply.md, decided before the application starts: the driver is one per
    machine, so a mismatch means no launch could be applied (the apply library checks it again, with the
    GPU of each context). Unknown on either side (results of a run that did not record it, a machine
    without a driver): left to the library, which then checks the GPU architecture only."""
    if tuned is None or here is None or tuned == here:
        return DriverCheck(True)
    what = (f"the results were tuned under CUDA driver {driver_name(tuned)} ({tuned}) and this machine has "
            f"{driver_name(here)} ({here})")
    if force:
        return DriverCheck(True, f"{what}; applying them anyway (--apply-force)")
    return DriverCheck(False, f"{what}: nothing is applied, the application runs unchanged; tune again under "
                              "this driver, or give --apply-force to apply the results anyway")


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64 (the apply library hashes the module the driver loaded the same way)."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def _pointer_words(params, pointer_offsets: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Each recorded pointer word as (parameter index, offset inside the parameter)."""
    out = []
    for off in pointer_offsets:
        for index, p in enumerate(params):
            if p.offset <= off and off + POINTER_SIZE <= p.offset + p.size:
                out.append((index, off - p.offset))
                break
    return tuple(out)


def _fixed_arguments(kernel: TunedKernel, params, arguments: bytes) -> tuple[tuple[int, bytes], ...]:
    """The argument values a specialized tuned code baked in: the launch must pass the same ones."""
    if not kernel.configuration.specialize:
        return ()
    if not params:
        raise ConfigurationError(
            f"{kernel.results_dir}: the best configuration specializes arguments, but the recording does not say "
            "where they are; tune without specialize, or record again with a current mneme"
        )
    return tuple((i, bytes(arguments[p.offset : p.offset + p.size])) for i, p in enumerate(params)
                 if p.kind != "pointer")


def plan_entry(kernel: TunedKernel, options: ApplyOptions, code_dir: Path, index: int) -> PlanEntry:
    """Compile the tuned code (once, here) and describe what the apply library matches."""
    from mneme.recording.execution import RecordedExecution
    from mneme.replay.compile import compile_for

    if "://" not in kernel.record_database and not Path(kernel.record_database).exists():
        raise ConfigurationError(
            f"{kernel.results_dir}: its recording {kernel.record_database} is not there any more; the tuned code is "
            "built from it, so keep the recording beside the results (or run from the directory `mneme tune` ran in)"
        )
    recording = RecordedExecution.from_json(kernel.record_database)
    instance = recording[kernel.record_id]
    if recording.code.cubin is None:
        raise ConfigurationError(
            f"{kernel.results_dir}: the recording holds no cubin of {recording.kernel_name}, so the application's "
            "loaded code cannot be checked against it; nothing is applied from it"
        )
    cc = (int(recording.device.compute_capability[0]), int(recording.device.compute_capability[1]))
    compiled = compile_for(recording, instance, kernel.configuration, f"sm_{cc[0]}{cc[1]}")
    code_path = None
    if compiled.tier != "recorded":
        code_path = code_dir / f"kernel{index}.cubin"
        code_path.write_bytes(compiled.image)
    config = kernel.configuration
    params = recording.kernel.params
    return PlanEntry(
        kernel_name=recording.kernel_name,
        static_hash=recording.static_hash,
        cubin_fnv=fnv1a64(recording.load_code("cubin")),
        recorded=Shape(instance.grid_dim, instance.block_dim, instance.shared_mem),
        tuned=Shape(config.grid, config.block, config.shared_mem),
        code_path=code_path,
        tier=compiled.tier,
        # Code specialized on the launch's dimensions runs right only with those dimensions.
        similar=options.apply_to == "similar" and not config.specialize_dims and not config.specialize,
        pointers=_pointer_words(params, instance.pointer_args),
        fixed=_fixed_arguments(kernel, params, instance.arguments),
        predicted_speedup=kernel.speedup,
        results_dir=kernel.results_dir,
        compute_capability=cc,
    )


def build_plan(kernels: list[TunedKernel], options: ApplyOptions, code_dir: Path,
               driver_here: int | None = None) -> ApplyPlan:
    """The plan for ``kernels`` (one per kernel and recorded shape; later results replace earlier ones).

    ``driver_here``: this machine's CUDA driver (``mneme.apply.device.driver_version()``); results tuned
    under another one give an empty plan and a note (``check_driver``), unless ``options.force``.
    """
    if not kernels:
        raise ConfigurationError("nothing to apply: give --apply RESULTS... (or MNEME_APPLY)")
    drivers = {k.driver_version for k in kernels if k.driver_version}
    if len(drivers) > 1:
        raise ConfigurationError(f"the results were tuned with different CUDA drivers ({sorted(drivers)}); apply those "
                                 "of one driver")
    tuned_driver = next(iter(drivers), None)
    driver = check_driver(tuned_driver, driver_here, options.force)
    notes = [driver.note] if driver.note else []
    if not driver.applies:  # nothing is compiled for a plan that cannot apply
        return ApplyPlan(options, (0, 0), tuned_driver, [], notes)
    entries: dict[tuple[str, tuple], PlanEntry] = {}
    for i, kernel in enumerate(kernels):
        if kernel.speedup is not None and kernel.speedup <= 1.0:
            notes.append(f"{kernel.results_dir}: its best configuration is not faster than the recorded launch "
                         f"(x{kernel.speedup:.3f}); {kernel.kernel_name} runs unchanged")
            continue
        entry = plan_entry(kernel, options, code_dir, i)
        entries[(entry.kernel_name, entry.recorded.line())] = entry
    names = [e.kernel_name for e in entries.values()]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ConfigurationError(
            f"several results tune {', '.join(duplicated)} for different launch shapes; the apply library holds "
            "one tuned configuration per kernel, so give one of them"
        )
    ccs = {e.compute_capability for e in entries.values()}
    if len(ccs) > 1:
        raise ConfigurationError(f"the results were tuned on different GPUs ({sorted(ccs)}); apply those of one GPU")
    if not entries:
        return ApplyPlan(options, (0, 0), None, [], notes)
    return ApplyPlan(options, ccs.pop(), tuned_driver, list(entries.values()), notes)
