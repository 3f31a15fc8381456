"""`mneme export-reproducer`: one recorded launch as a standalone folder (C++ and CMake, no Python, no mneme).

    mneme export-reproducer -rdb DIR/<static>.json [-rid <dynamic>] [-c CONFIG] [knob flags] -o OUT [--force]

The configuration is built as ``mneme replay`` builds it: the recorded launch,
then ``-c/--config FILE`` (JSON or YAML ``Replay-config``), then the knob flags.
The folder holds the code that configuration runs (the recorded cubin for the
baseline, a recompile otherwise), the memory in a raw format, and a C++ program
with its CMakeLists.txt (docs/replay.md#standalone-reproducer). Exit status 0
when written, 2 when it cannot be (unknown instance, an invalid configuration or
compile, a folder that is not empty without ``--force``, or not writable).
"""

from __future__ import annotations

import argparse

from mneme.cli.command import Command
from mneme.cli.replay import add_knob_arguments, build_config


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-rdb", "--record-db", required=True, metavar="DB.json",
                        help="recording database (<static-hash>.json, a directory holding one, or an s3:// URL)")
    parser.add_argument("-rid", "--record-id", metavar="ID",
                        help="dynamic instance id (may be omitted when the database holds one instance)")
    parser.add_argument("-o", "--output", required=True, metavar="DIR",
                        help="the folder to write (created; an existing one must be empty, or use --force)")
    parser.add_argument("-c", "--config", metavar="FILE",
                        help="configuration file (JSON or YAML Replay-config dict, as mneme replay --config takes)")
    parser.add_argument("--passes", metavar="PIPELINE",
                        help="LLVM pass pipeline (other than 'default<O3>' needs a recording with bitcode)")
    add_knob_arguments(parser)
    parser.add_argument("--arch", metavar="sm_XX",
                        help="GPU architecture of the exported cubin (default: the recorded cubin's)")
    parser.add_argument("-it", "--iterations", type=int, default=3, metavar="N",
                        help="the program's default number of timed launches (default 3)")
    parser.add_argument("--warmup", type=int, default=2, metavar="N",
                        help="the program's default number of launches before them (default 2)")
    parser.add_argument("--force", action="store_true",
                        help="write into a folder that is not empty (what an earlier export wrote there is replaced)")


def run(args: argparse.Namespace) -> int:
    from mneme.recording.execution import RecordedExecution
    from mneme.replay.compile import CompileOptions
    from mneme.reproducer import export_reproducer

    recording = RecordedExecution.from_json(args.record_db)
    instance = recording.select(args.record_id)
    config = build_config(args, instance)
    done = export_reproducer(
        recording, instance.record_id, args.output, config,
        arch=args.arch, compile_options=CompileOptions(max_registers=args.max_registers),
        iterations=args.iterations, warmup=args.warmup, force=args.force,
    )  # fmt: skip
    code = ("the recorded cubin" if done.code_tier == "recorded"
            else f"compiled by the configuration ({done.code_tier} tier)")
    print(f"mneme export-reproducer: wrote {done.directory}: {done.kernel} instance {done.record_id}, "
          f"code {code} for {done.arch}, {done.regions} regions ({done.memory_bytes} bytes), "
          f"{done.pointer_sites} pointer sites")
    print(f"build and run: {done.build_command}")
    return 0


COMMANDS = [Command("export-reproducer", "write one recorded launch as a standalone C++/CMake reproducer",
                    configure, run)]
