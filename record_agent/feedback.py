"""What ``mneme record`` tells its user: progress of a long conversion, the closing summary, a stats file.

The summary says what was recorded, how much device state was captured (and
how much of it was new data to store), how long the snapshots stalled the
application, and how long the conversion ran on after the application exited.
``MNEME_RECORD_STATS=FILE`` also writes every number as JSON (per instance:
the stall, snapshot bytes, the agent's stages; bench/record_overhead.py reads
it).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mneme.format.capture import PipelineStats
from record_agent.spool import committed_entries

if TYPE_CHECKING:
    from record_agent.convert import ConversionStats

@dataclass
class RecordSummary:
    """What a run did: the application's exit status and what was recorded where (``record_agent.session.record``)."""

    exit_code: int
    output: str = ""
    rank: int | None = None
    recorded: bool = True
    instances: int = 0
    databases: list[str] = field(default_factory=list)
    kernels: list[str] = field(default_factory=list)
    launches_seen: int | None = None
    abandoned: int = 0  # launches whose recording was cut short by the application's end (spool .tmp leftovers)
    deadline_abandoned: list[tuple[str, str]] = field(default_factory=list)  # (kernel, why): abandoned at a deadline
    errors: list[str] = field(default_factory=list)
    snapshot_bytes: int = 0  # device state copied off the GPU (prologues and epilogues)
    copied_bytes: int = 0  # of which copied off the device (the rest was unchanged since an earlier snapshot)
    stored_bytes: int = 0  # new chunk data written into the recording
    stall_s: float = 0.0  # the application waited this long for its snapshots
    spool_wait_s: float = 0.0  # ... and this long for the agent (spool full)
    app_s: float = 0.0  # the application's run, start to exit
    after_exit_s: float = 0.0  # conversion left when it exited
    instance_bytes: list[int] = field(default_factory=list)  # per instance: prologue + epilogue device state
    pool_allocators: list[str] = field(default_factory=list)  # pool allocators that made `auto` pick reachable


#: Show a progress bar for what is left to convert after the application exits from this many bytes on.
PROGRESS_MIN_BYTES = 256 << 20
STATS_ENV = "MNEME_RECORD_STATS"


def pending_bytes(spool_dir: str | Path) -> int:
    """Bytes of the committed, not yet converted entries (their snapshot stripe files)."""
    total = 0
    for entry in committed_entries(spool_dir):
        for f in entry.glob("*.bin"):
            try:
                total += f.stat().st_size
            except OSError:
                pass
    return total


class ConversionProgress:
    """A rich progress bar (bytes converted of those left) on a terminal, for large leftovers only."""

    def __init__(self, total_bytes: int, enabled: bool | None = None):
        if enabled is None:
            enabled = sys.stderr.isatty() and total_bytes >= PROGRESS_MIN_BYTES
        self._bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self._bar = Progress(
                TextColumn("mneme record: converting"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._task = self._bar.add_task("convert", total=total_bytes)

    def __enter__(self) -> "ConversionProgress":
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def advance(self, _done: int, nbytes: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=nbytes)


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"


def _per_instance(summary: "RecordSummary") -> str:
    """``, median M per instance (largest L)``: what one instance holds (prologue and epilogue)."""
    sizes = sorted(summary.instance_bytes)
    if not sizes:
        return ""
    return f", median {_size(sizes[(len(sizes) - 1) // 2])} per instance (largest {_size(sizes[-1])})"


def recorded_line(summary: "RecordSummary") -> str:
    """``recorded N instance(s) of K kernel(s) into DIR: what was captured, what it stalled, what ran on``."""
    watched = f" ({summary.launches_seen} launches watched)" if summary.launches_seen is not None else ""
    line = f"mneme record: recorded {summary.instances} instance(s) of {len(summary.kernels)} kernel(s) into {summary.output}{watched}"
    if summary.snapshot_bytes:
        line += (
            f"; {_size(summary.snapshot_bytes)} of device state captured{_per_instance(summary)} "
            f"({_size(summary.copied_bytes)} copied off the GPU, {_size(summary.stored_bytes)} new data stored), "
            f"the application stalled {summary.stall_s:.2f} s for snapshots"
        )
        if summary.spool_wait_s >= 0.01:
            line += f" and {summary.spool_wait_s:.2f} s for the agent (spool full)"
        if summary.after_exit_s >= 0.05:
            line += f", conversion ran {summary.after_exit_s:.2f} s after it exited"
        if summary.pool_allocators:
            line += f"; snapshots hold the reachable allocations ({', '.join(summary.pool_allocators)} detected)"
    return line


def stats_document(summary: "RecordSummary", stats: "ConversionStats") -> dict:
    total = PipelineStats()
    for entry in stats.entries:
        total.merge(entry.pipeline)
    return {
        "app_s": summary.app_s,
        "after_exit_s": summary.after_exit_s,
        "instances": summary.instances,
        "snapshot_bytes": summary.snapshot_bytes,
        "copied_bytes": summary.copied_bytes,
        "stored_bytes": summary.stored_bytes,
        "stall_s": summary.stall_s,
        "spool_wait_s": summary.spool_wait_s,
        "pipeline": total.as_dict(),
        "rates": total.rates(),
        "entries": [e.as_dict() for e in stats.entries],
        "abandoned": [{"kernel": kernel, "reason": reason} for kernel, reason in stats.abandoned],
    }


def write_stats(path: str, summary: "RecordSummary", stats: "ConversionStats") -> None:
    Path(path).write_text(json.dumps(stats_document(summary, stats), indent=1) + "\n")
