"""`mneme run`: run an unmodified application with tuned kernels applied.

    mneme run --apply RESULTS... [--apply-to exact|similar] [--apply-verify N] [--apply-force] -- ./app args...

RESULTS are results directories of `mneme tune` (or their export file); without
--apply, MNEME_APPLY names them. The application's output and exit status are
its own; the apply library adds one line per tuned kernel at exit
(docs/apply.md).
"""

from __future__ import annotations

import argparse
import sys

from mneme.cli.command import Command, add_application_argument, application_command


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--apply", nargs="+", default=[], metavar="RESULTS",
                        help="results directories of `mneme tune` (or their proteus_tuned_kernels.json) whose "
                             "verified best configurations are applied (default: $MNEME_APPLY)")
    parser.add_argument("--apply-to", choices=("exact", "similar"), default="exact",
                        help="exact (default): only launches with the recorded grid, block and shared memory; "
                             "similar: also other grids of the recorded block and shared memory")
    parser.add_argument("--apply-verify", type=int, default=0, metavar="N",
                        help="run the original beside the tuned code for the first N applied launches of each "
                             "kernel, compare on the device, and fall back to the original on any difference")
    parser.add_argument("--apply-force", action="store_true",
                        help="apply even when the GPU or the CUDA driver differs from the tuning run's")
    add_application_argument(parser)


def run(args: argparse.Namespace) -> int:
    from mneme.apply.plan import ApplyOptions
    from mneme.apply.session import results_from, run_with_apply

    command = application_command(args)
    options = ApplyOptions(apply_to=args.apply_to, verify=args.apply_verify, force=args.apply_force)
    result = run_with_apply(command, results_from(args.apply), options,
                            notes=lambda text: print(f"mneme run: {text}", file=sys.stderr))
    if result.reports is None:
        print("mneme run: the application ended before the apply library reported (killed, or it never "
              "initialized CUDA)", file=sys.stderr)
    return result.exit_code


COMMANDS = [Command("run", "run an application with tuned kernel configurations applied", configure, run)]
