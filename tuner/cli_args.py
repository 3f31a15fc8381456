"""The flags of ``mneme tune`` (the reference's names, plus mneme's few additions).

Every flag defaults to "not given" (``argparse.SUPPRESS``) so that
:func:`tuner.options.resolve_options` can tell a flag from a default and let
the command line override ``--config`` only where the user said so.
"""

from __future__ import annotations

import argparse

from mneme.model.verification import DEFAULT_RUNS
from replay_server.kept_servers import DEFAULT_KEEP_ALIVE_S
from tuner.objective import OBJECTIVES, SECONDARY_OBJECTIVES
from tuner.options import METRICS, PRUNERS, SAMPLERS
from tuner.space.builtin import BOOL_MODES, MAX_THREADS_POLICIES, PRESETS
from tuner.space.launch_shapes import LAUNCH_DIMS, LAUNCH_SAFETIES

S = argparse.SUPPRESS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The tuning run's flags (``mneme tune``'s subcommands on results directories are mneme.cli.tune's)."""
    parser.add_argument("--config", metavar="FILE.yml", default=S,
                        help="read settings from a YAML file; command-line flags override it")

    g = parser.add_argument_group("recording")
    g.add_argument("-rdb", "--record-database", "--record-db", dest="record_database", metavar="FILE.json",
                   default=S, help="the recording database (<static-hash>.json)")
    g.add_argument("-rid", "--record-id", dest="record_id", metavar="ID", default=S,
                   help="the kernel instance (dynamic hash) to tune; default: the database's only instance")

    g = parser.add_argument_group("search space")
    g.add_argument("--space-module", metavar="MODULE_OR_PATH:CLASS", default=S,
                   help="a SearchSpace class, constructed with the recorded kernel instance")
    g.add_argument("--space-arg", dest="space_args", action="append", metavar="KEY=VALUE", default=S,
                   help="extra constructor argument of --space-module (repeatable; VALUE is JSON when it parses)")
    g.add_argument("--space-preset", choices=PRESETS, default=S, help="built-in space scope (default: standard)")
    g.add_argument("--launch-dim", choices=LAUNCH_DIMS, default=S,
                   help="block axes to tune; auto = the axes with more than one thread (preset default)")
    g.add_argument("--launch-safety", choices=LAUNCH_SAFETIES, default=S,
                   help="threads per block: conservative <= recorded, balanced <= 2x, aggressive <= 1024")
    g.add_argument("--adaptive-invalid-ban", dest="adaptive_invalid_ban", action="store_true", default=S,
                   help="skip a block shape after it failed to launch (default)")
    g.add_argument("--no-adaptive-invalid-ban", dest="adaptive_invalid_ban", action="store_false", default=S)
    g.add_argument("--passes", nargs="+", metavar="PIPELINE", default=S, help="pass pipelines to try")
    g.add_argument("--fixed-passes", metavar="PIPELINE", default=S, help="use this one pipeline")
    g.add_argument("--pipeline-file", metavar="FILE", default=S, help="pipelines to try, one per line")
    g.add_argument("--codegen-opt-range", nargs=2, type=int, metavar=("LOW", "HIGH"), default=S,
                   help="codegen optimization levels to try (0..4)")
    g.add_argument("--fixed-codegen-opt", type=int, metavar="N", default=S, help="use this codegen level")
    for flag, what in (("--specialize-space", "argument specialization"),
                       ("--specialize-dims-space", "launch-dimension specialization"),
                       ("--launch-bounds-space", "launch bounds")):
        g.add_argument(flag, choices=BOOL_MODES, default=S, help=f"{what}: fixed, on, off or on-off (both)")
    g.add_argument("--max-threads-range", nargs=2, type=int, metavar=("LOW", "HIGH"), default=S,
                   help="launch-bound max threads (with --max-threads-policy powers-of-two)")
    g.add_argument("--max-threads-policy", choices=MAX_THREADS_POLICIES, default=S,
                   help="how launch bounds pick max threads (default block-threads)")
    g.add_argument("--min-blocks-per-sm-range", nargs=2, type=int, metavar=("LOW", "HIGH"), default=S,
                   help="launch-bound min blocks per SM to try")
    g.add_argument("--fixed-min-blocks-per-sm", type=int, metavar="N", default=S)

    g = parser.add_argument_group("sampling and evaluation")
    g.add_argument("--sampler", choices=SAMPLERS, default=S,
                   help="exhaustive (default) or grid enumerate; random, tpe and nsga2 need --trials")
    g.add_argument("--secondary-objective", choices=SECONDARY_OBJECTIVES, default=S,
                   help="second objective of --sampler nsga2 (default registers)")
    g.add_argument("--trials", type=int, metavar="N", default=S, help="configurations to evaluate (random, tpe)")
    g.add_argument("--seed", type=int, default=S, help="sampler seed, for reproducible runs")
    g.add_argument("--timeout", type=float, metavar="SECONDS", default=S,
                   help="stop submitting new candidates after this long")
    g.add_argument("--warmup", type=int, default=S, help="warm-up launches per replay (default 2)")
    g.add_argument("--iterations", type=int, default=S, help="measured launches per replay (default 5)")
    g.add_argument("--workers", type=int, default=S, help="concurrent replay workers (default 1)")
    g.add_argument("--metric", choices=METRICS, default=S, help="statistic of the measured launches (default mean)")
    g.add_argument("--objective", metavar="|".join(OBJECTIVES) + "|time,energy", default=S,
                   help="time (default): minimize the metric; speedup: maximize baseline / metric; energy: minimize "
                   "joules per launch (NVML's energy counter over an energy window of each verified configuration); "
                   "edp: minimize energy x time; a hardware counter (dram_bytes, instructions, ... minimized; "
                   "achieved_occupancy, l2_hit_rate, ... maximized; a raw CUPTI name, minimized), collected per trial "
                   "as --metrics does; a list such as time,energy or time,dram_bytes: NSGA-II's Pareto front of both "
                   "(--sampler nsga2)")
    g.add_argument("--metrics", action="append", metavar="NAME,...", default=S,
                   help="hardware counters every trial records (trials.jsonl 'metrics'), profiled after its timed "
                   "launches: curated names (mneme replay --list-metrics) or raw CUPTI metric names; repeatable")
    g.add_argument("--energy-window", type=float, metavar="SECONDS", default=S,
                   help="with --objective energy or edp: run each verified configuration's launches back to back at "
                   "least this long for its energy (default 0.1; longer while the counter has not stepped 3 times)")
    g.add_argument("--fail-fast", dest="fail_fast", action="store_true", default=S,
                   help="stop at the first candidate that fails")
    g.add_argument("--keep-going", dest="fail_fast", action="store_false", default=S,
                   help="record failures and go on (default)")
    g.add_argument("--servers", nargs="+", metavar="HOST:PORT", default=S,
                   help="replay on these replay servers instead of local workers")
    g.add_argument("--servers-from", metavar="DIR_OR_S3_PREFIX", default=S,
                   help="replay on every live server announced there (`mneme serve --announce`), including "
                   "ones that join later")
    g.add_argument("--keep-servers", nargs="?", type=float, const=DEFAULT_KEEP_ALIVE_S, metavar="SECONDS",
                   default=S, help="leave the local replay servers this run starts running for your next runs, "
                   "which use them instead of starting their own (a faster start); each exits after SECONDS "
                   f"without work (default {DEFAULT_KEEP_ALIVE_S:g}). Servers left running (by this or `mneme "
                   "serve --local`) are used in any case")
    g.add_argument("--lock-clocks", choices=("off", "base", "max"), default=S,
                   help="the local replay servers lock their GPUs' clocks while they serve (mneme serve "
                   "--lock-clocks: base or max; default off), and put them back at the end; where that is not "
                   "permitted they say so once and run at the GPU's own clocks")
    g.add_argument("--server-engine", metavar="MODULE:FACTORY", default=S, help=S)  # tests, benchmarks
    g.add_argument("--token-file", metavar="FILE", default=S,
                   help="bearer token the replay servers want (their --token-file)")
    g.add_argument("--tls-ca", metavar="FILE", default=S,
                   help="CA bundle: talk TLS to the replay servers and verify their certificates")
    g.add_argument("--tls-server-name", metavar="NAME", default=S,
                   help="the name the servers' certificates carry, when tuners dial them by IP address")

    g = parser.add_argument_group("optuna")
    g.add_argument("--study-name", default=S, help="Optuna study name (with --optuna-storage: continue it)")
    g.add_argument("--optuna-storage", metavar="URL", default=S,
                   help="Optuna storage other tuners may share: grpc://HOST:PORT (a `mneme study-server`), "
                   "sqlite:///study.db, postgresql://USER@HOST/DB, or journal:PATH (a file on a shared "
                   "filesystem); same --study-name = one search")
    g.add_argument("--pruner", choices=PRUNERS, default=S, help="Optuna pruner over per-launch values")

    g = parser.add_argument_group("outputs and run modes")
    g.add_argument("--results-dir", metavar="DIR", default=S,
                   help="where results go (default: a timestamped directory under mneme-tune-results/)")
    g.add_argument("--resume", action="store_true", default=S,
                   help="continue the run in --results-dir (its settings are read from DIR/config.json; a run "
                   "whose kernel, space, objective, measurement or tolerance differs is refused)")
    g.add_argument("--force", action="store_true", default=S,
                   help="when --results-dir holds another run (or --resume finds other settings there), start a "
                   "new run in a directory beside it (DIR-2, DIR-3, ...)")
    g.add_argument("--rerun-baseline", action="store_true", default=S, help="replay the baseline again on --resume")
    g.add_argument("--tolerance", action="append", default=S, metavar="auto|exact|SEL=dtype:mode:threshold[:norm]",
                   help="auto (default): regions the recorded launch's own runs show nondeterministic are judged "
                   "within a bound derived once from that spread; exact: bit-exact (or as annotated) only; "
                   "SEL=SPEC (repeatable, as mneme replay takes it, e.g. acc=f32:ulp:16 or '*=f64:relative:1e-9'): "
                   "the policy of a region (name, 0x base or '*'), which wins over annotations and derived bounds")
    g.add_argument("--tolerance-file", action="append", default=S, metavar="FILE.json",
                   help="per-region policies as JSON {selector: {dtype, mode, threshold, norm}} (as mneme replay)")
    g.add_argument("--tolerance-runs", type=int, metavar="N", default=S,
                   help=f"runs of the recorded launch that detect nondeterminism and derive the auto bounds "
                   f"(default {DEFAULT_RUNS})")
    g.add_argument("--no-relocate", action="store_true", default=S,
                   help="the servers restore the heap at its recorded addresses or the run stops saying why "
                   "(exit status 2), instead of replaying with relocated pointers where those addresses are taken")
    g.add_argument("--print-space", action="store_true", default=S, help="print the search space and exit")
    g.add_argument("--dry-run", action="store_true", default=S,
                   help="print the baseline and the search space, replay nothing")
    g.add_argument("--baseline-only", action="store_true", default=S, help="replay only the baseline")
    g.add_argument("--dump-config", metavar="PATH", default=S, help="write the resolved configuration and exit")
    g.add_argument("--quiet", action="store_true", default=S, help="no progress output")
    g.add_argument("--proteus-output", metavar="PATH", default=S,
                   help="tuned-kernels export (default: proteus_tuned_kernels.json in the results directory)")
    g.add_argument("--no-proteus-output", dest="proteus_output", action="store_const", const=False, default=S,
                   help="do not write the tuned-kernels export")
