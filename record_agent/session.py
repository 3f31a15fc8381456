"""One ``mneme record`` run: start the application under the recorder, convert while it runs, finish cleanly.

The application's stdin, stdout and stderr are its own (inherited), and its
exit status is returned unchanged (a death by signal N as 128+N, as shells
report it). SIGINT/SIGTERM/SIGHUP/SIGQUIT sent to the agent are forwarded to the application; whatever
the recorder committed before the application ended is converted, so a
crash or a kill leaves valid databases for everything fully recorded.

The application is started first: what the agent needs only to convert
(``record_agent.convert``, ``mneme.format``, the store, zstandard, BLAKE3) is
imported while the application starts, not before it. Before the exec the
command imports only what it must (argparse, subprocess, the options): no
dataclasses, typing, json, pathlib, shutil or tempfile
(tests/record_agent/test_capture_pipeline.py checks it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from mneme._internal.native_libs import cupti_library_file as cupti_library
from mneme._internal.native_libs import recorder_library_file as recorder_library
from mneme._internal.signals import exit_status, forward_signals, restore_signals
from mneme.errors import MnemeError, NotAvailableError
from record_agent.options import RecordOptions
from record_agent.ranks import detect_rank, rank_selected

TYPE_CHECKING = False
if TYPE_CHECKING:
    from record_agent.convert import SpoolConverter
    from record_agent.feedback import RecordSummary

POLL_INTERVAL_S = 0.05


def __getattr__(name: str):
    # RecordSummary lives in record_agent.feedback (a dataclass: loaded after the application starts).
    if name == "RecordSummary":
        from record_agent.feedback import RecordSummary

        return RecordSummary
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    """Run the application under the recorder and write its recordings; see the module docstring.

    Args:
        options: what to run and record, and where (``RecordOptions``).
        env: the application's environment (default: this process's).
        log: where the summary and warnings go (default: standard error).

    Returns:
        The ``RecordSummary``: the application's exit status and what was recorded where.
    """
    log = log or sys.stderr
    base_env = dict(os.environ if env is None else env)
    rank = detect_rank(base_env)
    if not rank_selected(rank, options.record_ranks):
        from record_agent.feedback import RecordSummary

        return RecordSummary(_run_unrecorded(options.command), rank=rank, recorded=False)

    app_env = application_environment(options, "", rank, base_env)  # fails early if the recorder is missing
    destination = output_location(options, rank)
    staging = None
    uploader = None
    if options.is_s3:
        import shutil
        import tempfile

        staging = tempfile.mkdtemp(prefix="mneme-record-staging-")
        local_dir = staging
        try:
            uploader = _start_uploader(local_dir, destination, options.spool_max_bytes)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    else:
        local_dir = destination
        os.makedirs(local_dir, exist_ok=True)
    spool_dir = _make_spool_dir(base_env.get("MNEME_SPOOL_PARENT"))
    app_env["MNEME_SPOOL_DIR"] = spool_dir
    started = time.monotonic()
    try:
        proc = subprocess.Popen(list(options.command), env=app_env)
    except FileNotFoundError as exc:
        import shutil

        shutil.rmtree(spool_dir, ignore_errors=True)
        raise NotAvailableError(f"cannot start {options.command[0]!r}: {exc.strerror}; check the path after '--'") from exc
    exit_seen = _watch_exit(proc)

    previous = forward_signals(proc)
    conversion_error: BaseException | None = None
    try:
        # Loaded while the application starts (its CUDA initialization alone takes longer).
        import shutil
        from pathlib import Path

        from record_agent.feedback import STATS_ENV, ConversionProgress, RecordSummary, pending_bytes, write_stats
        from record_agent.spool import abandoned_entries, read_json

        summary = RecordSummary(0, output=destination, rank=rank)

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
        exited = min(time.monotonic(), exit_seen())  # a conversion may have run on past the exit
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


def _make_spool_dir(parent: str | None) -> str:
    """A fresh private spool directory (``tempfile.mkdtemp`` without importing tempfile before the exec)."""
    if not parent:
        parent = next((os.environ[v] for v in ("TMPDIR", "TEMP", "TMP") if os.environ.get(v)), "/tmp")
    for _ in range(100):
        path = os.path.join(parent, f"mneme-spool-{os.urandom(6).hex()}")
        try:
            os.mkdir(path, 0o700)
            return os.path.abspath(path)
        except FileExistsError:
            continue
        except OSError:
            break
    import tempfile  # an unusual temporary directory: let tempfile find one that works (or say why not)

    return tempfile.mkdtemp(prefix="mneme-spool-", dir=parent if os.path.isdir(parent) else None)


def _watch_exit(proc: subprocess.Popen):
    """When the application exits, noted by a thread (``waitid`` with ``WNOWAIT``: ``proc`` still reaps it).

    The agent notices the exit only between two conversions; the time it reports as the application's
    run (``app_s``) is the exit itself. Returns a function giving that time (``time.monotonic()``; +inf
    while it runs).
    """
    seen: list[float] = []

    def wait() -> None:
        try:
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        except OSError:  # reaped already (then the agent's own time stands), or no waitid here
            return
        seen.append(time.monotonic())

    threading.Thread(target=wait, name="mneme-exit-watch", daemon=True).start()
    return lambda: seen[0] if seen else float("inf")


def _converter(options: RecordOptions, rank: int | None, spool_dir: str, local_dir: str, base_env: dict[str, str],
               uploader) -> "SpoolConverter":
    """The spool converter writing into ``local_dir`` (the destination, or the S3 upload's staging directory)."""
    import datetime
    import shutil
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

    By default nothing is fsync'ed: a recording's GBs would go at the disk's speed, many times slower than
    the page cache, and a ``syncfs`` per database waits for all of them. Renames keep every object whole,
    so a killed application or agent never leaves a partial one. ``--durable``: one ``syncfs`` before each
    database is committed, and an fsync of the database. ``MNEME_RECORD_SYNC=1``: an fsync per object.

    Args:
        options: the run's options (``durable``).
        env: the environment (``MNEME_RECORD_SYNC``).

    Returns:
        ``object``, ``commit`` or ``none``.
    """
    if env.get("MNEME_RECORD_SYNC") == "1":
        return "object"
    return "commit" if options.durable else "none"


def _stop_recorder(spool_dir: str) -> None:
    """Ask the recorder to record nothing more (it checks for this file before each recording)."""
    try:
        with open(os.path.join(spool_dir, "stop"), "w") as f:
            f.write("the record agent failed to write the recording\n")
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
