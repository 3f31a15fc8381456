"""One ``mneme record`` run: start the application under the recorder, convert while it runs, finish cleanly.

The application's stdin, stdout and stderr are its own (inherited), and its
exit status is returned unchanged (a death by signal N as 128+N, as shells
report it). SIGINT/SIGTERM/SIGHUP/SIGQUIT sent to the agent are forwarded to the application; whatever
the recorder committed before the application ended is converted, so a
crash or a kill leaves valid databases for everything fully recorded.

The application is started first: what the agent needs only to convert
(``record_agent.convert``, ``mneme.format``, the store, zstandard, BLAKE3) is
imported while the application starts, not before it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mneme._internal.native_libs import cupti_library, recorder_library
from mneme._internal.signals import exit_status, forward_signals, restore_signals
from mneme.errors import MnemeError, NotAvailableError
from record_agent.options import RecordOptions
from record_agent.ranks import detect_rank, rank_selected

if TYPE_CHECKING:
    from record_agent.convert import SpoolConverter

POLL_INTERVAL_S = 0.05


@dataclass
class RecordSummary:
    """What a run did: the application's exit status and what was recorded where."""

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


def output_location(options: RecordOptions, rank: int | None) -> str:
    """Where the databases go: the directory/URL itself, or ``<it>/rank<N>`` in an MPI run (one database set per rank)."""
    base = options.record_db_dir.rstrip("/")
    return base if rank is None else f"{base}/rank{rank}"


def application_environment(options: RecordOptions, spool_dir: str, rank: int | None, base_env: dict[str, str]) -> dict[str, str]:
    """The application's environment: its own plus the recorder's injection and settings."""
    library = str(recorder_library(base_env))
    env = dict(base_env)
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = library + (" " + preload if preload else "")
    env["CUDA_INJECTION64_PATH"] = library
    # Lazy module loading (the driver's default) is what the recorder expects: it loads a kernel's module
    # itself when it records the kernel. --eager-loading loads every module at start-up (docs/recording.md).
    if options.eager_loading:
        env["CUDA_MODULE_LOADING"] = "EAGER"
    cupti = cupti_library(base_env)
    if cupti is not None:
        env.setdefault("MNEME_CUPTI_PATH", str(cupti))
    env.update(options.recorder_environment(spool_dir, rank))
    return env


def _run_unrecorded(command: tuple[str, ...]) -> int:
    try:
        return exit_status(subprocess.call(list(command)))
    except FileNotFoundError as exc:
        raise NotAvailableError(f"cannot start {command[0]!r}: {exc.strerror}; check the path after '--'") from exc


def record(options: RecordOptions, *, env: dict[str, str] | None = None, log=None) -> RecordSummary:
    """Run the application under the recorder and write its recordings; see the module docstring."""
    log = log or sys.stderr
    base_env = dict(os.environ if env is None else env)
    rank = detect_rank(base_env)
    if not rank_selected(rank, options.record_ranks):
        return RecordSummary(_run_unrecorded(options.command), rank=rank, recorded=False)

    app_env = application_environment(options, "", rank, base_env)  # fails early if the recorder is missing
    destination = output_location(options, rank)
    staging = None
    uploader = None
    if options.is_s3:
        staging = tempfile.mkdtemp(prefix="mneme-record-staging-")
        local_dir = staging
        try:
            uploader = _start_uploader(local_dir, destination, options.spool_max_bytes)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    else:
        local_dir = destination
        Path(local_dir).mkdir(parents=True, exist_ok=True)
    spool_dir = tempfile.mkdtemp(prefix="mneme-spool-", dir=base_env.get("MNEME_SPOOL_PARENT") or None)
    app_env["MNEME_SPOOL_DIR"] = spool_dir
    summary = RecordSummary(0, output=destination, rank=rank)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(list(options.command), env=app_env)
    except FileNotFoundError as exc:
        shutil.rmtree(spool_dir, ignore_errors=True)
        raise NotAvailableError(f"cannot start {options.command[0]!r}: {exc.strerror}; check the path after '--'") from exc

    previous = forward_signals(proc)
    conversion_error: BaseException | None = None
    try:
        # Loaded while the application starts (its CUDA initialization alone takes longer).
        from record_agent.feedback import STATS_ENV, ConversionProgress, pending_bytes, write_stats
        from record_agent.spool import abandoned_entries, read_json

        converter = _converter(options, rank, spool_dir, local_dir, base_env, uploader)
        while proc.poll() is None:
            if conversion_error is None:
                try:
                    converter.convert_ready()
                except (MnemeError, OSError) as exc:
                    conversion_error = exc
                    _stop_recorder(spool_dir)
            try:
                proc.wait(timeout=POLL_INTERVAL_S)  # returns as soon as the application ends
            except subprocess.TimeoutExpired:
                pass
        summary.exit_code = exit_status(proc.returncode)
        exited = time.monotonic()
        summary.app_s = exited - started
        if conversion_error is None:
            try:
                with ConversionProgress(pending_bytes(spool_dir)) as progress:
                    converter.convert_ready(progress.advance)
            except (MnemeError, OSError) as exc:
                conversion_error = exc
        summary.after_exit_s = time.monotonic() - exited
    finally:
        restore_signals(previous, proc)

    done = read_json(Path(spool_dir) / "done.json")
    recorder_error = read_json(Path(spool_dir) / "error.json")
    summary.launches_seen = None if done is None else done.get("launches_seen")
    summary.abandoned = len(abandoned_entries(spool_dir))
    summary.instances = converter.stats.instances
    summary.deadline_abandoned = list(converter.stats.abandoned)
    summary.databases = sorted(converter.stats.databases)
    summary.kernels = sorted(converter.stats.kernels)
    summary.snapshot_bytes = sum(e.snapshot_bytes for e in converter.stats.entries)
    summary.copied_bytes = sum(e.copied_bytes for e in converter.stats.entries)
    summary.instance_bytes = [e.snapshot_bytes for e in converter.stats.entries]
    summary.pool_allocators = sorted({e.pool_allocator for e in converter.stats.entries if e.pool_allocator})
    summary.stored_bytes = converter.stats.stored_bytes
    summary.stall_s = converter.stats.stall_s
    summary.spool_wait_s = converter.stats.spool_wait_s
    if recorder_error and recorder_error.get("error"):
        summary.errors.append(f"the recorder stopped: {recorder_error['error']}")
    if conversion_error is not None:
        summary.errors.append(f"writing the recording failed: {conversion_error}")
    if read_json(Path(spool_dir) / "recorder.json") is None:
        summary.errors.append(
            "the recorder never started inside the application (not a CUDA program, a static binary, or CUDA "
            "initialization failed); nothing was recorded"
        )
    shutil.rmtree(spool_dir, ignore_errors=True)

    if uploader is not None:
        try:
            uploader.close()
        except MnemeError as exc:
            summary.errors.append(f"upload to {destination} failed: {exc}; the recording is kept in {staging}, "
                                  f"finish with: mneme push --resume {staging} {destination}")
            staging = None
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
    _report(summary, log)
    if base_env.get(STATS_ENV):
        write_stats(base_env[STATS_ENV], summary, converter.stats)
    return summary


def _converter(options: RecordOptions, rank: int | None, spool_dir: str, local_dir: str, base_env: dict[str, str],
               uploader) -> "SpoolConverter":
    """The spool converter writing into ``local_dir`` (the destination, or the S3 upload's staging directory)."""
    import datetime
    import socket

    import mneme
    from mneme.format import RecorderInfo
    from mneme.store import LocalStore, open_store
    from record_agent.convert import SpoolConverter

    store = LocalStore(open_store(local_dir).root, durability=record_durability(options, base_env))  # type: ignore[attr-defined]
    recorder_info = RecorderInfo(
        mneme.__version__,
        socket.gethostname(),
        rank,
        datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        tuple(options.command),
    )
    return SpoolConverter(
        spool_dir,
        store,
        executable=shutil.which(options.command[0]) or options.command[0],
        recorder=recorder_info,
        on_commit=uploader.notify if uploader else None,
        before_write=(lambda: uploader.wait_for_space()) if uploader else None,
        env=base_env,
    )


def record_durability(options: RecordOptions, env: dict[str, str]) -> str:
    """What of the recording survives a machine crash (``LocalStore`` durability; docs/recording.md, Robustness).

    By default nothing is fsync'ed: a recording's GBs would go at the disk's speed (2 GB/s against the page
    cache's 15-40 on the H100 machine) and a ``syncfs`` per database waits for all of them (1.4 s for
    2.3 GB on the H200 host). Renames keep every object whole, so a killed application or agent never
    leaves a partial one. ``--durable``: one ``syncfs`` before each database is committed, and an fsync of
    the database. ``MNEME_RECORD_SYNC=1``: an fsync per object.
    """
    if env.get("MNEME_RECORD_SYNC") == "1":
        return "object"
    return "commit" if options.durable else "none"


def _stop_recorder(spool_dir: str) -> None:
    """Ask the recorder to record nothing more (it checks for this file before each recording)."""
    try:
        Path(spool_dir, "stop").write_text("the record agent failed to write the recording\n")
    except OSError:
        pass


def _start_uploader(staging_dir: str, destination: str, spool_limit: int):
    """Upload the staging directory while the application runs.

    ``spool_limit`` bounds the chunk bytes waiting for upload: the agent waits
    (and with it the recorder) rather than fill the local disk while the
    network is slow or down.
    """
    try:
        from mneme.store.uploader import Uploader
    except ImportError as exc:
        raise NotAvailableError(
            "recording into s3:// needs mneme.store.uploader, which this mneme does not have; "
            "record into a directory and upload it with `mneme push`"
        ) from exc
    return Uploader(staging_dir, destination, spool_limit=spool_limit).start()


def _report(summary: RecordSummary, log) -> None:
    from record_agent.feedback import recorded_line

    if summary.instances:
        print(recorded_line(summary), file=log)
    elif not summary.errors:
        # The recorder watches launches only while a loaded kernel matches the selection.
        seen = f" ({summary.launches_seen} launches watched)" if summary.launches_seen is not None else ""
        print(f"mneme record: nothing recorded{seen}; check --kernel, --instances and -mr", file=log)
    if summary.deadline_abandoned:
        kernels = len({k for k, _ in summary.deadline_abandoned})
        _, first_reason = summary.deadline_abandoned[0]
        print(f"mneme record: {len(summary.deadline_abandoned)} instance(s) of {kernels} kernel(s) were abandoned at a "
              f"deadline and written unsupported (`mneme ls --long` says why; --deadline raises it); the first: "
              f"{first_reason}", file=log)
    if summary.abandoned:
        print(f"mneme record: {summary.abandoned} launch(es) were being recorded when the application ended; they are not in the recording", file=log)
    for error in summary.errors:
        print(f"mneme record: error: {error}", file=log)
