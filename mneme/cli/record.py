"""`mneme record`: run an application and record its kernel launches.

    mneme record -rdb DIR [-vass GIB] [--kernel REGEX ...] [-sr N] [-mr N] [--instances SPEC]
                 [--snapshot-scope auto|all|reachable] [--max-snapshot-bytes N] [-rr all|0,2,...]
                 [--device N] [--eager-loading] [--deadline SECONDS] [--durable] -- ./app args...

The application runs unchanged (its output and exit status are its own); the
record agent (``record_agent``) does the work.
"""

from __future__ import annotations

import argparse
import os

from mneme.cli.command import Command, add_application_argument, application_command
from mneme.errors import ConfigurationError


def _size(text: str) -> int:
    """Bytes, with an optional K/M/G/T suffix (powers of 1024)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    factor = 1
    if t and t[-1] in units:
        factor, t = units[t[-1]], t[:-1]
    try:
        value = float(t) * factor
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (use e.g. 512M, 8G or a byte count)") from None
    if value < 0:
        raise argparse.ArgumentTypeError("a size cannot be negative")
    return int(value)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-rdb", "--record-db-dir", required=True, metavar="DIR",
                        help="where the recording databases go: a directory or s3://bucket/prefix")
    parser.add_argument("-vass", "--virtual-address-space-size", dest="vass", type=float, default=4.0, metavar="GIB",
                        help="size of the fixed-address allocation window per GPU, in GiB (default 4)")
    parser.add_argument("--kernel", action="append", default=[], metavar="REGEX",
                        help="record only kernels whose mangled or demangled name matches (repeatable)")
    parser.add_argument("-sr", "--skip-recordings", type=int, default=0, metavar="N",
                        help="skip the first N launches of each kernel (default 0)")
    parser.add_argument("-mr", "--max-recordings", type=int, default=4, metavar="N",
                        help="record at most N distinct instances per kernel (default 4; 0: no limit)")
    parser.add_argument("--instances", metavar="SPEC",
                        help="which launches of each kernel to record: indices, ranges and slices, e.g. 0,5-7,100::50")
    parser.add_argument("--snapshot-scope", choices=("auto", "all", "reachable"), default="auto",
                        help="snapshot every live allocation (all), only those reachable from arguments and globals "
                             "(reachable), or reachable where a pool allocator (PyTorch, CuPy, RMM, an argument inside a "
                             "region of 1 GiB or more) holds the memory and all otherwise (auto, the default)")
    parser.add_argument("--max-snapshot-bytes", type=_size, default=0, metavar="N",
                        help="skip instances whose snapshot is larger (e.g. 8G; default: no limit)")
    parser.add_argument("-rr", "--record-ranks", default="0", metavar="all|0,2,...",
                        help="MPI ranks that record (default 0)")
    parser.add_argument("--device", type=int, action="append", default=[], metavar="N",
                        help="record launches on this GPU only (repeatable; default: all GPUs)")
    parser.add_argument("--record-duplicates", action="store_true",
                        help="record a launch again even when its shape and arguments equal a recorded one")
    parser.add_argument("--eager-loading", action="store_true",
                        help="load every CUDA module at start-up (CUDA_MODULE_LOADING=EAGER) instead of at first launch; "
                             "for drivers older than CUDA 12.4 (no cuFuncLoad), where lazy loading leaves parameter "
                             "layouts unknown")
    parser.add_argument("--spool-max-bytes", type=_size, default=8 << 30, metavar="N",
                        help="bound of the local spool; the application waits while it is full (default 8G)")
    parser.add_argument("--deadline", type=float, default=5.0, metavar="SECONDS",
                        help="longest the recorder makes the application wait, per wait (a snapshot's adds 1 s per GB); "
                             "past it the instance is abandoned, written unsupported, and the application goes on "
                             "(default 5)")
    parser.add_argument("--durable", action="store_true",
                        help="make every database and the chunks it names survive a machine crash (power loss, kernel "
                             "panic): one syncfs of the file system before each database is committed, which waits for "
                             "the disk; without it a killed application or agent still never leaves a partial object")
    add_application_argument(parser)


def run(args: argparse.Namespace) -> int:
    from mneme.recording.window import DEFAULT_VA_BASE
    from record_agent.options import RecordOptions, parse_instances, parse_ranks
    from record_agent.session import record

    command = application_command(args)
    va_base = DEFAULT_VA_BASE
    if os.environ.get("MNEME_VA_BASE"):
        try:
            va_base = int(os.environ["MNEME_VA_BASE"], 0)
        except ValueError:
            raise ConfigurationError(f"MNEME_VA_BASE={os.environ['MNEME_VA_BASE']!r} is not an address (e.g. 0x200000000000)") from None
    options = RecordOptions(
        command=tuple(command),
        record_db_dir=args.record_db_dir,
        vass_gib=args.vass,
        kernel_regexes=tuple(args.kernel),
        skip_recordings=args.skip_recordings,
        max_recordings=args.max_recordings,
        instances=parse_instances(args.instances) if args.instances is not None else (),
        snapshot_scope=args.snapshot_scope,
        max_snapshot_bytes=args.max_snapshot_bytes,
        record_ranks=parse_ranks(args.record_ranks),
        devices=tuple(args.device),
        record_duplicates=args.record_duplicates,
        va_base=va_base,
        spool_max_bytes=args.spool_max_bytes,
        deadline_s=args.deadline,
        eager_loading=args.eager_loading,
        durable=args.durable,
    )
    summary = record(options)
    if summary.errors and summary.exit_code == 0:
        return 2  # the application succeeded but the recording did not
    return summary.exit_code


COMMANDS = [Command("record", "run an application and record its kernel launches", configure, run)]
