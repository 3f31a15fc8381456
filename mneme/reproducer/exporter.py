"""``export_reproducer``: one recorded launch as a self-contained folder that builds and runs without mneme.

The bytes come from mneme's own readers (the recording's snapshots and code,
verified as they are read) and the code from the replay's compile path
(``compile_for``: the recorded cubin for the baseline, a recompile for any
other configuration). The folder holds the raw memory and launch description
(``raw_format``), the kernel's cubin and PTX, and a C++ program with its
CMakeLists.txt (``templates/``) that restores, launches, times and compares.
"""

from __future__ import annotations

import bisect
import json
import os
import shutil
import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from mneme.errors import ConfigurationError, MnemeError, NotAvailableError
from mneme.model.experiment import ExperimentConfiguration
from mneme.reproducer.raw_format import (
    FORMAT_VERSION,
    MemoryWriter,
    PointerSite,
    RawLaunch,
    RawRegion,
    pointers_text,
    regions_text,
)

#: Everything an export writes into its folder (``--force`` replaces these, and only these).
FOLDER_ENTRIES = (
    "README.md", "CMakeLists.txt", "reproducer.cpp", "config.json", "launch.txt", "regions.txt", "pointers.txt",
    "kernel.cubin", "kernel.ptx", "memory",
)  # fmt: skip
POINTER_SIZE = 8


class ExportError(MnemeError):
    """The reproducer folder cannot be written (exists and is not empty, not writable)."""


@dataclass(frozen=True)
class ExportedReproducer:
    """What ``export_reproducer`` wrote."""

    directory: Path
    kernel: str
    record_id: str
    code_tier: str  # "recorded" (the application's cubin), "ptx" or "llvm" (recompiled for the configuration)
    arch: str
    regions: int
    memory_bytes: int  # per memory file
    pointer_sites: int
    skipped_regions: int  # parameter-space regions, which the replay does not restore either

    @property
    def build_command(self) -> str:
        d = self.directory
        return f"cmake -S {d} -B {d}/build && cmake --build {d}/build && {d}/build/reproducer"


def export_reproducer(
    recording: Any,
    record_id: str | None,
    directory: str | os.PathLike[str],
    config: ExperimentConfiguration | None = None,
    *,
    arch: str | None = None,
    compile_options: Any = None,
    iterations: int = 3,
    warmup: int = 2,
    force: bool = False,
) -> ExportedReproducer:
    """Write the standalone reproducer of one recorded launch into ``directory``.

    Everything is checked before the folder is touched: the instance (the
    recorder's reasons if it could not capture it; texture and surface objects,
    which the program does not recreate), its launch attributes, the
    configuration and its code. A failure while writing removes what was written.

    Args:
        recording: a ``RecordedExecution``.
        record_id: the instance (None: the only one).
        directory: the folder; created, or empty, or (``force``) one whose export entries are replaced.
        config: the launch and code to reproduce (default: the recorded launch, the recorded cubin).
        arch: the GPU architecture the code is for (default: the recorded cubin's, else the recording device's).
        compile_options: ``mneme.replay.compile.CompileOptions`` (register cap) for a recompile.
        iterations: the program's default number of timed launches.
        warmup: the program's default number of launches before them.
        force: write into a folder that is not empty (its earlier export entries are removed first).

    Returns:
        What was written (``ExportedReproducer``).
    """
    from mneme.replay.compile import CompileOptions, compile_for
    from mneme.replay.launch_attrs import plan_for

    instance = recording.select(record_id)
    instance.require_supported()
    if getattr(instance, "textures", ()):
        raise NotAvailableError(
            f"instance {instance.record_id} reads texture or surface objects, which a standalone reproducer does "
            "not recreate; replay it with mneme replay"
        )
    plan = plan_for(instance.launch_attributes)
    config = config or ExperimentConfiguration(
        grid=instance.grid_dim, block=instance.block_dim, shared_mem=instance.shared_mem
    )
    errors = config.validation_errors() + plan.launch_errors(config.grid.as_tuple())
    if iterations < 1 or warmup < 0:
        errors.append(f"iterations={iterations} must be at least 1 and warmup={warmup} not negative")
    if errors:
        raise ConfigurationError("invalid configuration: " + "; ".join(errors))
    options = compile_options or CompileOptions()
    arch = arch or recording.code.arch or "sm_{}{}".format(*recording.device.compute_capability)
    code = compile_for(recording, instance, config, arch, options)
    ptx = code.ptx.encode() if code.ptx is not None else (
        recording.load_code("ptx") if recording.code.ptx is not None else None
    )
    prologue, epilogue = instance.load_prologue(), instance.load_epilogue()

    out = Path(directory)
    created = _prepare(out, force)
    try:
        raw_regions, sites, skipped, total = _write_memory(out, recording.store, prologue, epilogue, instance)
        launch = RawLaunch(
            kernel=recording.kernel_name, demangled=recording.kernel.demangled, static_hash=recording.static_hash,
            record_id=instance.record_id, code_tier=code.tier, arch=code.arch,
            heap=recording.address_space.mode, grid=config.grid.as_tuple(), block=config.block.as_tuple(),
            shared_mem=config.shared_mem, args=instance.arguments, iterations=iterations, warmup=warmup,
            params=tuple((p.offset, p.size, p.kind) for p in recording.kernel.params),
            attributes=tuple((i, n, v) for (i, v), n in zip(plan.attributes, plan.names)),
            jit_max_registers=options.max_registers,
        )  # fmt: skip
        sites += _argument_sites(instance, recording.kernel.params, raw_regions)
        (out / "kernel.cubin").write_bytes(code.image)
        if ptx is not None:
            (out / "kernel.ptx").write_bytes(ptx)
        (out / "regions.txt").write_text(regions_text(raw_regions), encoding="utf-8")
        (out / "pointers.txt").write_text(pointers_text(sites), encoding="utf-8")
        (out / "config.json").write_text(json.dumps({"Replay-config": config.to_dict()}, indent=2) + "\n",
                                        encoding="utf-8")
        for name in ("reproducer.cpp", "CMakeLists.txt"):
            (out / name).write_bytes(_template(name).encode())
        readme = _readme(recording, launch, raw_regions, sites, skipped, ptx is not None)
        (out / "README.md").write_text(readme, encoding="utf-8")
        (out / "launch.txt").write_text(launch.text(), encoding="utf-8")  # last: a folder without it is incomplete
    except BaseException as exc:
        _remove_entries(out, remove_folder=created)
        if isinstance(exc, OSError):
            raise ExportError(f"cannot write {out}: {exc.strerror or exc}") from None
        raise
    return ExportedReproducer(out, recording.kernel_name, instance.record_id, code.tier, code.arch,
                              len(raw_regions), total, len(sites), skipped)  # fmt: skip


def _prepare(out: Path, force: bool) -> bool:
    """Make ``out`` ready to be written; whether it was created here."""
    try:
        if out.exists() or out.is_symlink():
            if not out.is_dir():
                raise ExportError(f"cannot write {out}: it exists and is not a folder")
            if any(out.iterdir()):
                if not force:
                    raise ExportError(f"cannot write {out}: it exists and is not empty (--force writes over it)")
                _remove_entries(out, remove_folder=False)
            probe = out / ".mneme-write-probe"
            probe.write_bytes(b"")
            probe.unlink()
            return False
        out.mkdir(parents=True)
        return True
    except OSError as exc:
        raise ExportError(f"cannot write {out}: {exc.strerror or exc}") from None


def _remove_entries(out: Path, *, remove_folder: bool) -> None:
    if remove_folder:
        shutil.rmtree(out, ignore_errors=True)
        return
    for name in FOLDER_ENTRIES:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists() or path.is_symlink():
            path.unlink()


def _write_memory(out: Path, store: Any, prologue: Any, epilogue: Any, instance: Any):
    """The memory files and the region and pointer lines: heap and global regions as the replay restores them."""
    from mneme.replay.relocation import Move, RelocationMap, read_values
    from mneme.replay.state import pair_regions, written_spans

    pairs = pair_regions(prologue, epilogue)
    skipped = sum(1 for r in prologue.regions if r.kind not in ("heap", "global"))
    # Every recorded range stays where it was: the map only finds the values that point into one.
    scan = RelocationMap(Move(p.base, p.size, p.base) for p, _ in pairs)
    finder = _RegionFinder([(p.base, p.size) for p, _ in pairs])
    regions: list[RawRegion] = []
    sites: list[PointerSite] = []
    with MemoryWriter(out) as memory:
        for index, (p, e) in enumerate(pairs):
            before, after = p.read(store), e.read(store)
            offset = memory.append(before, after)
            policy = e.policy or p.policy
            regions.append(RawRegion(
                index, p.kind, p.base, p.size, offset, bool(written_spans(p, e, prologue.chunk_size)),
                "bitwise" if policy is None else policy.spec(), p.name,
            ))  # fmt: skip
            for where, data in (("prologue", before), ("epilogue", after)):
                found = scan.pointer_sites(data, p.base % POINTER_SIZE)
                for site, value in zip(found.tolist(), read_values(data, found).tolist()):
                    sites.append(PointerSite(where, index, site, finder.index(value)))
        total = memory.offset
    return regions, sites, skipped, total


def _argument_sites(instance: Any, params: Any, regions: list[RawRegion]) -> list[PointerSite]:
    """Pointer arguments that point into a recorded region (the replay's pointer offsets)."""
    finder = _RegionFinder([(r.base, r.size) for r in regions])
    offsets = set(instance.pointer_args) | {p.offset for p in params if p.kind == "pointer"}
    args = instance.arguments
    out = []
    for offset in sorted(offsets):
        if offset + POINTER_SIZE <= len(args):
            target = finder.index(int.from_bytes(args[offset : offset + POINTER_SIZE], "little"))
            if target is not None:
                out.append(PointerSite("args", None, offset, target))
    return out


class _RegionFinder:
    """The index of the region an address falls in (half-open ranges, as the replay's relocation has them)."""

    def __init__(self, ranges: list[tuple[int, int]]):
        self._sorted = sorted((base, size, i) for i, (base, size) in enumerate(ranges) if size > 0)
        self._starts = [base for base, _, _ in self._sorted]

    def index(self, address: int) -> int | None:
        k = bisect.bisect_right(self._starts, address) - 1
        if k < 0:
            return None
        base, size, i = self._sorted[k]
        return i if address < base + size else None


def _template(name: str) -> str:
    return resources.files("mneme.reproducer").joinpath("templates", name).read_text(encoding="utf-8")


def _readme(recording: Any, launch: RawLaunch, regions: list[RawRegion], sites: list[PointerSite],
            skipped: int, has_ptx: bool) -> str:  # fmt: skip
    code = {
        "recorded": f"the application's own cubin ({launch.arch}), as the recording holds it",
        "ptx": f"the recorded PTX rewritten and compiled for {launch.arch} by the configuration (config.json)",
        "llvm": f"the recorded LLVM bitcode compiled for {launch.arch} by the configuration (config.json)",
    }[launch.code_tier]
    notes = []
    if skipped:
        notes.append(f"- {skipped} parameter-space region(s) of the recording are not restored "
                     "(`mneme replay` does not restore them either).")
    tolerant = [r for r in regions if r.policy != "bitwise"]
    if tolerant:
        listed = ", ".join(f"{r.label} ({r.policy})" for r in tolerant)
        notes.append(f"- The recording verifies {listed} within a tolerance; this program compares every "
                     "region byte for byte and says so when such a region differs.")
    if launch.heap == "relocatable":
        notes.append("- The recording is relocatable: the heap is placed wherever the driver gives memory, "
                     "and the pointers in pointers.txt are rewritten.")
    if not has_ptx:
        notes.append("- The recording has no PTX: on a GPU the cubin does not load on, the program cannot run.")
    values = {
        "kernel": launch.kernel,
        "demangled": launch.demangled or launch.kernel,
        "record_id": launch.record_id,
        "static_hash": launch.static_hash,
        "source": recording.path,
        "grid": "x".join(map(str, launch.grid)),
        "block": "x".join(map(str, launch.block)),
        "shared_mem": str(launch.shared_mem),
        "code": code,
        "regions": str(len(regions)),
        "memory_bytes": str(sum(r.size for r in regions)),
        "pointer_sites": str(len(sites)),
        "attributes": ", ".join(n for _, n, _ in launch.attributes) or "none",
        "format": str(FORMAT_VERSION),
        "notes": "\n".join(notes) or "- None.",
    }
    return string.Template(_template("README.md")).substitute(values)
