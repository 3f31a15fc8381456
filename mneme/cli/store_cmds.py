"""Artifact-store subcommands: push, pull, ls, check, gc, clean, copy, move.

Every location is a directory or an ``s3://bucket/prefix`` URL (settings of
S3 in docs/store.md). The work is done by :mod:`mneme.store.transfer`,
:mod:`mneme.store.check`, :mod:`mneme.store.cleanup` and
:mod:`mneme.store.summary`; this module only parses arguments and prints
reports (``--json``: the report as one JSON object on standard output). Exit
status: 0 done, 2 bad input or an unusable store (one line on stderr);
``check`` exits 1 when it found damage.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

from mneme.cli.command import Command, add_json_argument, print_json

LOCATION_HELP = "a recording directory or s3://bucket/prefix"


def _transfer_arguments(parser: argparse.ArgumentParser, *, recordings: bool = True) -> None:
    parser.add_argument("source", metavar="SRC", help=f"where the recordings are ({LOCATION_HELP})")
    parser.add_argument("destination", metavar="DST", help=f"where they go ({LOCATION_HELP})")
    if recordings:
        parser.add_argument("recordings", nargs="*", metavar="RECORDING",
                            help="static hashes (or <static>.json names) of the recordings to transfer; default: all")
    parser.add_argument("--resume", action="store_true",
                        help="continue a killed transfer: keep files the destination already holds intact "
                             "(chunks are never sent twice in any case)")
    parser.add_argument("--repair", action="store_true",
                        help="verify what the destination already holds of these recordings (every chunk and "
                             "file read and hashed, even for unchanged recordings) and replace damaged objects "
                             "with the source's verified copy; implies --resume")
    _workers_arguments(parser, "parallel object transfers")
    _retries_argument(parser)
    add_json_argument(parser, "the report (recordings committed and already there, chunks, files, bytes)")


def _workers_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--workers", type=int, default=8, help=f"{what} (default 8)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show a progress bar (default: when stderr is a terminal)")


def _retries_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--retries", type=int, default=8, metavar="N",
                        help="attempts per operation when the store is unreachable, with exponential backoff "
                             "(default 8: about a minute)")


def _retry(args: argparse.Namespace):
    from mneme.errors import ConfigurationError
    from mneme.store.retry import RetryPolicy

    if args.retries < 1:
        raise ConfigurationError(f"--retries must be at least 1, got {args.retries}")
    return RetryPolicy(attempts=args.retries)


def _grace_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--grace", type=float, default=3600.0, metavar="SECONDS",
                        help="keep unreferenced objects younger than this: they may belong to an upload in "
                             "progress (default 3600)")


def _grace(args: argparse.Namespace) -> float:
    from mneme.errors import ConfigurationError

    if not args.grace >= 0:
        raise ConfigurationError(f"--grace must be a number of seconds >= 0, got {args.grace}")
    return args.grace


def _check_workers(args: argparse.Namespace) -> None:
    from mneme.errors import ConfigurationError

    if args.workers < 1:
        raise ConfigurationError(f"--workers must be at least 1, got {args.workers}")


def _print_report(report, as_json: bool) -> None:
    """A store command's report: its summary line, or (``--json``) its data."""
    if as_json:
        print_json(report.to_json())
    else:
        print(report.summary())


def _run_transfer(args: argparse.Namespace) -> int:
    from mneme.store.transfer import transfer

    _check_workers(args)
    report = transfer(args.source, args.destination, recordings=getattr(args, "recordings", None) or None,
                      resume=args.resume, repair=args.repair, workers=args.workers, progress=args.progress,
                      retry=_retry(args))
    if not report.recordings:
        from mneme.errors import ArtifactError

        raise ArtifactError(f"no recording database (<static-hash>.json) in {report.source}; check the path")
    _print_report(report, args.json)
    return 0


def _configure_move(parser: argparse.ArgumentParser) -> None:
    _transfer_arguments(parser)
    _grace_argument(parser)


def _run_move(args: argparse.Namespace) -> int:
    from mneme.store.transfer import move

    _check_workers(args)
    report, cleaned = move(args.source, args.destination, recordings=args.recordings or None, grace_s=_grace(args),
                           resume=args.resume, repair=args.repair, workers=args.workers, progress=args.progress,
                           retry=_retry(args))
    if args.json:
        print_json({"transfer": report.to_json(), "clean": cleaned.to_json()})
    else:
        print(report.summary())
        print(cleaned.summary())
    return 0


def _configure_ls(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("location", metavar="URL", help=LOCATION_HELP)
    parser.add_argument("-l", "--long", action="store_true", help="also list every instance (launch shape)")
    add_json_argument(parser)
    _retries_argument(parser)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _run_ls(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from mneme.store.summary import summarize

    summary = summarize(args.location, _retry(args))
    if args.json:
        data = asdict(summary)
        data["dedupe_ratio"] = summary.dedupe_ratio
        for rec, item in zip(summary.recordings, data["recordings"]):
            item["dedupe_ratio"] = rec.dedupe_ratio
        print_json(data)
        return 0
    table = Table(title=f"recordings in {summary.url}", title_justify="left")
    columns = ("recording", "kernel", "instances", "memory", "largest instance", "stored", "dedupe")
    for column in columns:
        table.add_column(column, justify="left" if column in ("recording", "kernel") else "right")
    for rec in summary.recordings:
        count = str(len(rec.instances)) + (f" ({rec.unsupported_count} unsupported)" if rec.unsupported_count else "")
        table.add_row(rec.database, rec.kernel, count, _size(rec.logical_bytes),
                      _size(rec.largest_instance_bytes), _size(rec.unique_chunk_bytes), f"{rec.dedupe_ratio:.1f}x")
        if args.long:
            for inst in rec.instances:
                grid, block = "x".join(map(str, inst.grid)), "x".join(map(str, inst.block))
                table.add_row("", f"  {inst.dynamic_hash}", "", f"grid {grid}", _size(inst.captured_bytes),
                              f"block {block}", f"smem {inst.shared_mem}")
                if inst.unsupported:
                    table.add_row("", "    unsupported: " + "; ".join(inst.unsupported), "", "", "", "", "")
    console = Console(width=200 if not Console().is_terminal else None)
    console.print(table)
    unsupported = sum(r.unsupported_count for r in summary.recordings)
    console.print(
        f"{len(summary.recordings)} recording(s), {sum(len(r.instances) for r in summary.recordings)} instance(s)"
        + (f" ({unsupported} unsupported: replay refuses them, `mneme ls --long` says why)" if unsupported else "")
        + "; "
        f"memory {_size(summary.logical_bytes)} stored in {summary.chunk_count} chunk(s) of "
        f"{_size(summary.stored_chunk_bytes)}: dedupe ratio {summary.dedupe_ratio:.1f}x",
        highlight=False,
    )
    return 0


def _configure_check(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("location", metavar="URL", help=LOCATION_HELP)
    parser.add_argument("recordings", nargs="*", metavar="RECORDING",
                        help="static hashes (or <static>.json names) of the recordings to check; default: all")
    parser.add_argument("--read-data", action="store_true",
                        help="also read every chunk and code file and check it against its hash (else: every "
                             "database and snapshot manifest is read and verified, every other object must exist "
                             "with its size)")
    add_json_argument(parser, "the report (ok, the damaged objects)")
    _workers_arguments(parser, "parallel reads")
    _retries_argument(parser)


def _run_check(args: argparse.Namespace) -> int:
    from mneme.errors import ArtifactError
    from mneme.store.check import check_store

    _check_workers(args)
    report = check_store(args.location, args.recordings or None, read_data=args.read_data, workers=args.workers,
                         retry=_retry(args), progress=args.progress)
    if not report.recordings:
        raise ArtifactError(f"no recording database (<static-hash>.json) in {report.store}; check the path")
    if args.json:
        print_json(report.to_json())
    else:
        for line in report.lines():
            print(line)
        print(report.summary())
        if not report.ok:
            print(f"repair: mneme push --repair GOOD_COPY {report.store} "
                  f"{' '.join(r.removesuffix('.json') for r in report.damaged_recordings)}")
    return 0 if report.ok else 1


def _configure_gc(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("location", metavar="URL", help=LOCATION_HELP)
    _grace_argument(parser)
    parser.add_argument("--dry-run", action="store_true", help="only report what would be removed")
    _retries_argument(parser)
    add_json_argument(parser, "the report (what was removed, or would be)")


def _run_gc(args: argparse.Namespace) -> int:
    from mneme.store.cleanup import gc

    _print_report(gc(args.location, grace_s=_grace(args), dry_run=args.dry_run, retry=_retry(args)), args.json)
    return 0


def _configure_clean(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("location", metavar="URL", help=LOCATION_HELP)
    parser.add_argument("recordings", nargs="*", metavar="RECORDING",
                        help="static hashes (or <static>.json names) of the recordings to delete")
    parser.add_argument("--all", action="store_true", help="delete every recording in the store")
    _grace_argument(parser)
    parser.add_argument("--keep-chunks", action="store_true", help="leave unreferenced chunks to a later `mneme gc`")
    parser.add_argument("--dry-run", action="store_true", help="only report what would be removed")
    _retries_argument(parser)
    add_json_argument(parser, "the report (what was removed, or would be)")


def _run_clean(args: argparse.Namespace) -> int:
    from mneme.errors import ConfigurationError
    from mneme.store.cleanup import clean

    if bool(args.recordings) == bool(args.all):
        raise ConfigurationError("name the recordings to delete (static hashes, see `mneme ls`) or pass --all")
    report = clean(args.location, args.recordings or None, grace_s=_grace(args),
                   collect_chunks=not args.keep_chunks, dry_run=args.dry_run, retry=_retry(args))
    _print_report(report, args.json)
    return 0


COMMANDS = [
    Command("push", "upload recordings to a store (chunks first, each database last; --resume after a kill)",
            _transfer_arguments, _run_transfer),
    Command("pull", "download recordings from a store (into an empty directory: the same layout, byte-exact)",
            _transfer_arguments, _run_transfer),
    Command("ls", "list recordings, kernels, instances, sizes and the dedupe ratio of a store", _configure_ls, _run_ls),
    Command("check", "check that every object the recordings of a store name is present and intact (--read-data: "
            "re-hash every chunk and file); exit status 1 when damage is found, as restic check",
            _configure_check, _run_check),
    Command("gc", "remove chunks and files no recording references (older than --grace)", _configure_gc, _run_gc),
    Command("clean", "delete recordings from a store", _configure_clean, _run_clean),
    Command("copy", "copy recordings between stores", _transfer_arguments, _run_transfer),
    Command("move", "move recordings between stores (copy, then delete the source)", _configure_move, _run_move),
]
