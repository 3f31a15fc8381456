"""`mneme replay`: replay one recorded kernel instance and verify it.

    mneme replay -rdb DIR/<static>.json [-rid <dynamic>] ["default<O3>"] [overrides]

The configuration starts from the recorded launch (grid, block, dynamic shared
memory), then takes ``--config FILE`` (JSON or YAML, a ``Replay-config`` dict,
partial is fine), then the flags. It prints the replay configuration and the
result as the reference does (``"Replay-config": {...}`` and ``"Result": {...}``),
or one JSON object with ``--json``. Exit status: 0 verified, 1 replayed but not
verified (or failed), 2 could not replay (bad input, no GPU, an instance the
recorder could not capture, recorded addresses not available with ``--no-relocate``).
A replay that had to relocate the heap says so and why (``relocated``,
``relocation_reason`` in the result, and a note on stderr). The result records
the GPU's clocks, temperature, power and clock-event reasons around the measured
launches (``conditions``; a note on stderr when the GPU throttled); ``--energy``
adds an energy window (``energy_j`` per launch, ``power_w``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from mneme.cli.command import Command
from mneme.errors import ConfigurationError
from mneme.model.measurement import DEFAULT_ENERGY_WINDOW_S, MeasurementSettings
from mneme.model.verification import DEFAULT_RUNS

_DIMS = (("grid", "gid", "grid-dim"), ("block", "bid", "block-dim"))


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-rdb", "--record-db", metavar="DB.json",
                        help="recording database (<static-hash>.json, a directory holding one, or an s3:// URL); "
                        "required unless --list-metrics")
    parser.add_argument("-rid", "--record-id", metavar="ID",
                        help="dynamic instance id (may be omitted when the database holds one instance)")
    parser.add_argument("passes", nargs="?", default=None,
                        help="LLVM pass pipeline, e.g. 'default<O3>' (other pipelines need a recording with bitcode)")
    add_knob_arguments(parser)
    parser.add_argument("-it", "--iterations", type=int, default=3, metavar="N", help="timed launches (default 3)")
    parser.add_argument("--warmup", type=int, default=2, metavar="N", help="untimed-for-ranking launches first (default 2)")
    parser.add_argument("--config", metavar="FILE", help="configuration file (JSON or YAML Replay-config dict)")
    parser.add_argument("--tolerance", action="append", default=[], metavar="exact|auto|SEL=dtype:mode:threshold[:norm]",
                        help="verification policy for a region (by name, 0x base or '*'), e.g. c=f32:relative:1e-6:l2 "
                        "or acc=f32:ulp:16; repeatable. 'auto': regions the recorded launch's own runs show to be "
                        "nondeterministic get a bound derived from their spread (stored beside the recording); "
                        "'exact' (default): recorded annotations, else bitwise")
    parser.add_argument("--tolerance-runs", type=int, default=DEFAULT_RUNS, metavar="N",
                        help="runs of the recorded launch that detect nondeterminism and derive 'auto' bounds "
                        f"(default {DEFAULT_RUNS})")
    parser.add_argument("--tolerance-file", action="append", default=[], metavar="FILE.json",
                        help="verification policies as JSON {selector: {dtype, mode, threshold, norm}}")
    parser.add_argument("--device", type=int, default=0, metavar="N", help="CUDA device ordinal (default 0)")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S",
                        help="give up on a kernel that runs longer than this (default 60 s)")
    parser.add_argument("--verify-every-launch", action="store_true",
                        help="compare with the epilogue after every launch (default: after the first and the last)")
    parser.add_argument("--timing", choices=("events", "cupti"), default="events",
                        help="time each launch with CUDA events (default) or CUPTI kernel activity records")
    parser.add_argument("--reset", choices=("auto", "always"), default="auto",
                        help="restore the memory the kernel writes before every launch (always), or only before "
                        "each configuration's first launch once the baseline proved idempotent (auto, default)")
    parser.add_argument("--no-relocate", action="store_true",
                        help="restore heap buffers at their recorded addresses or fail (exit status 2) saying why, "
                        "instead of relocating them (rewriting pointers) when those addresses are taken here")
    parser.add_argument("--energy", action="store_true",
                        help="after a verified replay, run the launches back to back for an energy window and report "
                        "joules per launch and mean power (energy_j, power_w; NVML's energy counter)")
    parser.add_argument("--energy-window", type=float, default=DEFAULT_ENERGY_WINDOW_S, metavar="S",
                        help=f"the energy window's length at least (default {DEFAULT_ENERGY_WINDOW_S:g} s)")
    parser.add_argument("--metrics", action="append", default=[], metavar="NAME,...",
                        help="hardware counters of one launch, profiled after the timed launches (CUPTI's range "
                        "profiler, one launch per pass, memory reset and L2 flushed before each): curated names "
                        "(dram_bytes, achieved_occupancy, sm_throughput, l2_hit_rate, warp_stalls, ...: "
                        "--list-metrics) or raw CUPTI metric names (dram__bytes.sum); in the result's 'metrics'")
    parser.add_argument("--list-metrics", action="store_true",
                        help="print the curated metric names and their raw CUPTI metrics, and exit")
    parser.add_argument("--chip", metavar="NAME",
                        help="with --list-metrics: resolve the names for this chip (GH100, GA100, ...) instead of "
                        "the GPU's")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the key-value blocks")


def add_knob_arguments(parser: argparse.ArgumentParser) -> None:
    """The configuration's knobs as flags (launch shape, specialization, launch bounds, code generation).

    ``mneme replay`` and ``mneme export-reproducer`` take the same ones; ``build_config`` reads them.

    Args:
        parser: the command's parser.
    """
    for key, short, long in _DIMS:
        for axis in "xyz":
            parser.add_argument(f"-{short}{axis}", f"--{long}-{axis}", dest=f"{key}_{axis}", type=int,
                                metavar="N", help=f"{key}Dim.{axis} (default: recorded)")
    parser.add_argument("-shem", "--shared-mem", type=int, metavar="BYTES", help="dynamic shared memory (default: recorded)")
    parser.add_argument("--specialize", action=argparse.BooleanOptionalAction, default=None,
                        help="recorded scalar arguments as constants in the code")
    parser.add_argument("-slb", "--set-launch-bounds", action=argparse.BooleanOptionalAction, default=None,
                        help="put launch bounds (.maxntid/.minnctapersm) on the kernel")
    parser.add_argument("--max-threads", type=int, metavar="N", help="launch bound: max threads per block")
    parser.add_argument("--min-blocks-per-sm", type=int, metavar="N", help="launch bound: min resident blocks per SM")
    parser.add_argument("-sdims", "--specialize-dims", action=argparse.BooleanOptionalAction, default=None,
                        help="block and grid dimensions as constants in the code")
    parser.add_argument("-co", "--codegen-opt", type=int, metavar="0-4", help="code generation optimization level")
    parser.add_argument("--max-registers", type=int, metavar="N", help="register cap per thread (ptxas --maxrregcount)")


def load_config_file(path: str) -> dict[str, Any]:
    """A configuration dict from JSON or YAML; a ``{"Replay-config": {...}}`` wrapper is accepted."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read the configuration file {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except ValueError:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigurationError(f"the configuration file {path} is neither JSON nor YAML ({exc})") from None
    if isinstance(data, dict) and "Replay-config" in data:
        data = data["Replay-config"]
    if not isinstance(data, dict):
        raise ConfigurationError(f"the configuration file {path} must hold a dict of configuration keys")
    return data


def build_config(args: argparse.Namespace, instance: Any):
    """Recorded launch, then the config file, then the flags."""
    from mneme.model.experiment import ExperimentConfiguration

    data: dict[str, Any] = {
        "grid": instance.grid_dim.to_dict(),
        "block": instance.block_dim.to_dict(),
        "shared_mem": instance.shared_mem,
    }
    if args.config:
        file_data = load_config_file(args.config)
        for key in ("grid", "block"):
            if isinstance(file_data.get(key), dict):
                data[key] = {**data[key], **file_data.pop(key)}
        data.update(file_data)
    for key, _, _ in _DIMS:
        for axis in "xyz":
            value = getattr(args, f"{key}_{axis}")
            if value is not None:
                data[key] = {**data[key], axis: value}
    flags = {
        "shared_mem": args.shared_mem,
        "specialize": args.specialize,
        "set_launch_bounds": args.set_launch_bounds,
        "max_threads": args.max_threads,
        "min_blocks_per_sm": args.min_blocks_per_sm,
        "specialize_dims": args.specialize_dims,
        "codegen_opt": args.codegen_opt,
        "passes": args.passes,
    }
    data.update({k: v for k, v in flags.items() if v is not None})
    config = ExperimentConfiguration.from_dict(data)
    errors = config.validation_errors()
    if args.iterations < 1:
        errors.append(f"--iterations {args.iterations} must be at least 1")
    if args.warmup < 0:
        errors.append(f"--warmup {args.warmup} must not be negative")
    if errors:
        raise ConfigurationError("invalid replay configuration: " + "; ".join(errors))
    return config


def format_output(config_dict: dict[str, Any], result_dict: dict[str, Any], as_json: bool) -> str:
    if as_json:
        return json.dumps({"Replay-config": config_dict, "Result": result_dict}, indent=2)
    return (
        f'"Replay-config": {json.dumps(config_dict, indent=2)}\n'
        f'"Result": {json.dumps(result_dict, indent=2)}'
    )


def measurement_notes(result: Any, energy: bool) -> list[str]:
    """What the user should know about a result's measurement: a throttled GPU, energy not measured.

    Args:
        result: the replay's ExperimentResult.
        energy: whether ``--energy`` was asked for.

    Returns:
        Lines for stderr.
    """
    notes = []
    conditions = result.conditions or {}
    if conditions.get("throttled"):
        notes.append(f"measured while the GPU throttled ({', '.join(conditions.get('throttle_reasons') or [])}): "
                     "the times may be slower than the GPU's usual (conditions in the result)")
    if energy and result.verified and not result.energy_j > 0:
        error = (conditions.get("energy") or {}).get("error") or conditions.get("unavailable") or "unknown"
        notes.append(f"energy not measured: {error}")
    return notes


def run(args: argparse.Namespace) -> int:
    if args.list_metrics:
        print(list_metrics(args.chip, args.device))
        return 0
    from mneme.recording.execution import RecordedExecution
    from mneme.replay.compile import CompileOptions
    from mneme.replay.engine import require_driver
    from mneme.replay.metrics import parse_metric_names
    from mneme.replay.tolerance import verification_from_flags

    if not args.record_db:
        raise ConfigurationError("-rdb/--record-db is required: the recording database (<static-hash>.json)")
    metrics = parse_metric_names(args.metrics)
    recording = RecordedExecution.from_json(args.record_db)
    instance = recording.select(args.record_id)
    instance.require_supported()  # the recorder's reasons (exit status 2), not a CUDA fault
    config = build_config(args, instance)
    verification = verification_from_flags(args.tolerance, args.tolerance_file, args.tolerance_runs,
                                           args.no_relocate, every_iteration=args.verify_every_launch)
    options = CompileOptions(max_registers=args.max_registers)
    try:
        measurement = MeasurementSettings(energy=args.energy, energy_window_s=args.energy_window)
    except ConfigurationError as exc:
        raise ConfigurationError(f"--energy-window: {exc}") from None
    native = require_driver()  # no GPU: a clear error (exit 2) before any work
    if metrics:
        check_metrics(native, metrics, args.device)  # an unknown name or a profiler that cannot run: exit 2 now

    from mneme.replay import Replayer
    from mneme.replay.proof import decide_resets

    # A kernel that consumes its own state may hang or fault when launched twice without a reset:
    # the proof runs in a child process (once per instance and machine: cached), never in this one.
    decision = decide_resets(recording, instance.record_id, args.device, verification, args.timeout) \
        if args.reset == "auto" else None
    with Replayer(
        recording,
        instance.record_id,
        device=args.device,
        verification=verification,
        compile_options=options,
        timeout_s=args.timeout,
        timing=args.timing,
        reset=args.reset,
        reset_decision=decision,
        measurement=measurement,
    ) as replayer:
        result = replayer.run(config, iterations=args.iterations, warmup=args.warmup, metrics=metrics)
        if replayer.last_profile:
            profile = replayer.last_profile
            missing = f"; not on the {profile['chip']}: {', '.join(profile['missing'])}" if profile["missing"] else ""
            print(f"mneme replay: metrics: {profile['passes']} profiler pass(es) on the {profile['chip']}{missing}",
                  file=sys.stderr)
        if replayer.derived is not None:
            print(f"mneme replay: tolerance auto: {replayer.derived.describe()}; {replayer.derived_stored}",
                  file=sys.stderr)
        if replayer.relocated_heap:
            print(f"mneme replay: note: the heap was relocated (pointers to it rewritten): {replayer.relocation_reason}; "
                  "--no-relocate refuses instead", file=sys.stderr)
        lost = not replayer.healthy and result.status in ("runtime_error", "timeout")
    for note in measurement_notes(result, args.energy):
        print(f"mneme replay: note: {note}", file=sys.stderr)
    print(format_output(config.to_dict(), result.to_dict(), args.json))
    if result.metrics_error:
        print(f"mneme replay: error: metrics: {result.metrics_error}", file=sys.stderr)
    sys.stdout.flush()
    if lost:
        # The CUDA context is dead or still busy with a kernel that never ends: leave without
        # the interpreter's clean-up, which could wait for that kernel.
        sys.stderr.flush()
        os._exit(1)
    if result.metrics_error and result.executed:
        return 2  # the counters asked for could not be collected
    return 0 if result.verified else 1


def check_metrics(native: Any, metrics: tuple[str, ...], device: int) -> None:
    """Resolve ``metrics`` on the device's chip before any replay: an unknown name (with close names) or a
    host where the profiler cannot run is an error now (exit status 2), not after the replay."""
    from mneme.errors import NotAvailableError
    from mneme.replay.metrics import explain, resolve

    reason = native.profiler_unavailable_reason()
    if reason:
        raise NotAvailableError(f"--metrics: hardware counters are not available here: {reason}")
    try:
        chip = native.profiler_chip_name(device)
    except native.ProfilerError as exc:
        raise NotAvailableError(f"--metrics: {explain(exc)}") from None
    resolve(metrics, chip, native)


def list_metrics(chip: str | None, device: int = 0) -> str:
    """``--list-metrics``: the curated names, their units and raw CUPTI metrics; resolved for ``chip`` (or
    the GPU's, when one is here) when CUPTI's host side can."""
    from mneme.replay.metrics import CURATED, GROUPS, resolve

    native = _profiler_engine()
    if chip is None and native is not None:
        try:
            from mneme.replay.engine import driver_available

            chip = native.profiler_chip_name(device) if driver_available() else None
        except Exception:  # noqa: BLE001 - no GPU or no profiler: the generic list
            chip = None
    lines = [f"{'name':<26} {'unit':<24} raw CUPTI metric{' on the ' + chip if chip else ' (first the chip has)'}"]
    for metric in CURATED.values():
        raw = " | ".join(metric.raw)
        if chip and native is not None:
            try:
                raw = resolve([metric.name], chip, native).raw[0]
            except Exception as exc:  # noqa: BLE001 - a metric this chip lacks
                raw = f"(none on the {chip})" if "has none" in str(exc) else f"({exc})"
        lines.append(f"{metric.name:<26} {metric.unit:<24} {raw}")
    for group, members in GROUPS.items():
        lines.append(f"{group:<26} {'(group)':<24} {', '.join(members)}")
    lines.append("Any raw CUPTI metric name the GPU supports is accepted too (e.g. lts__t_sectors_op_read.sum).")
    return "\n".join(lines)


def _profiler_engine() -> Any:
    """The engine module when its profiler loads here (None otherwise)."""
    try:
        from mneme.replay.engine import load_engine

        native = load_engine()
    except Exception:  # noqa: BLE001 - the engine is not built
        return None
    return native if hasattr(native, "profiler_unavailable_reason") and not native.profiler_unavailable_reason() \
        else None


COMMANDS = [Command("replay", "replay one recorded kernel instance and verify it", configure, run)]
