"""One ``mneme tune`` run, from resolved options to a complete results directory."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, TextIO

from mneme import __version__
from mneme._internal.startup_trace import mark
from mneme.apply.device import driver_version
from mneme.errors import NotAvailableError
from mneme.model.experiment import (
    STATUS_VERIFIED,
    ExperimentConfiguration,
    ExperimentResult,
)
from tuner.errors import ServersUnreachableError, TuningError
from tuner.interrupts import sigterm_as_interrupt
from tuner.loop import Executor, LoopState, TuningLoop, now_iso
from tuner.objective import counter_names, effective_status, energy_missing_reason, metric_value
from tuner.options import TuneOptions
from tuner.preflight import check_servers
from tuner.progress import Reporter, format_ns, make_reporter
from tuner.recording import KernelIdentity, check_region_selectors, load_instance
from tuner.results.coverage import space_coverage
from tuner.results.directory import ResultsDirectory, default_results_dir, dumps
from tuner.results.export import write_export
from tuner.results.fingerprint import run_fingerprint
from tuner.results.summary import best_document, summary_document, verification_counts
from tuner.results.table import pareto_rows, render_top_table, top_configurations
from tuner.resume import check_resumable, choose_results_dir
from tuner.space.factory import build_space
from tuner.space.search_space import (
    SearchSpace,
    baseline_checked,
    code_variants,
    describe_space,
)
from tuner.strategies import make_strategy

#: (options, results directory, configurations whose code to compile ahead) -> executor
ExecutorFactory = Callable[[TuneOptions, Path, "list[ExperimentConfiguration]"], Executor]
InstanceLoader = Callable[[str, "str | None"], "tuple[Any, KernelIdentity]"]


def default_executor(options: TuneOptions, results_dir: Path,
                     compile_ahead: "list[ExperimentConfiguration]" = (), local_servers: Any = None) -> Executor:
    """The real executor: local replay workers, or the replay servers of ``--servers``; the servers
    compile ``compile_ahead``'s code while they prepare the instance. ``local_servers``: the local
    servers the run started early (:class:`PrestartedServers`)."""
    try:
        from replay_server.client.executor import AsyncReplayExecutor
    except ImportError as exc:
        raise NotAvailableError(f"replay_server.client.executor is not available ({exc}); reinstall mneme") from exc
    connection = options.connection
    if options.servers_from:  # the servers announced there now; the rest as they join (replay_server.discovery)
        from replay_server.discovery import follow, wait_for_servers

        connection = connection.with_(servers=wait_for_servers(options.servers_from))
    executor = AsyncReplayExecutor(
        record_db=options.record_database,
        record_id=options.record_id,
        iterations=options.iterations,
        warmup=options.warmup,
        results_db_dir=str(results_dir / "replays"),
        num_workers=options.workers,
        compile_ahead=compile_ahead,
        local_servers=local_servers,
        verification=options.verification,
        connection=connection,
        record_key=getattr(local_servers, "record_key", None),  # kept servers: the database's key in their store
        measurement=options.measurement,
        **({"metrics": options.counters} if options.counters else {}),
    )
    if options.servers_from:
        follow(executor, options.servers_from)
    return executor


default_executor.adopts_local_servers = True  # takes local_servers= (the run starts them early)
default_executor.dials_servers = True  # replays on --servers: the run dials them before anything starts


class PrestartedServers:
    """The local replay servers of a real run, started (in a thread: finding the GPUs initializes CUDA)
    before the run reads the recording and builds its space, so that the servers' and workers' start-up
    overlaps that work. ``take()`` hands them to the executor; ``discard()``, at the end of the run, tells
    them to stop in any case (the executor did already, unless it failed to start).

    Local servers left running by an earlier run or by ``mneme serve --local`` that match are used
    instead (:mod:`replay_server.kept_servers`); those, and the ones started with ``--keep-servers``, are never
    told to stop."""

    def __init__(self, options: TuneOptions) -> None:
        self._servers: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, args=(options,), name="prestart-servers", daemon=True)
        self._thread.start()

    def _start(self, options: TuneOptions) -> None:
        try:
            self._servers = _reusable_servers(options)
            if self._servers is not None:
                mark("executor", "reused")
                return
            from replay_server.client.local_servers import LocalServers, split_database

            # wait_on_stop=False: the run ends without waiting for the servers' GPU teardown
            self._servers = LocalServers.start_with(split_database(options.record_database)[0], options.workers,
                                                    options.connection, wait_on_stop=False)
        except BaseException as exc:  # raised where the executor is made, as it would have been there
            self._error = exc

    def describe(self) -> str:
        """For the user: servers reused or left running ("" for servers that stop with the run)."""
        servers = self._servers
        if getattr(servers, "reused", False):
            pids = ", ".join(str(pid) for pid in servers.pids)
            return f"using the local replay server(s) left running (pid {pids}): no start-up to wait for"
        return servers.describe_kept() if servers is not None else ""

    def take(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._servers

    def discard(self) -> None:
        self._thread.join()
        if self._servers is not None:
            self._servers.stop()


def _reusable_servers(options: TuneOptions) -> Any:
    """Kept local servers this run can use (replay_server.kept_servers), or None; a failure to look is no reason to
    fail the run: it starts its own servers."""
    from replay_server.client.reuse import find_reusable

    if options.connection.lock_clocks != "off":  # a kept server runs at whatever clocks it was started with
        return None
    try:
        return find_reusable(options.record_database, options.workers, options.connection.engine)
    except Exception as exc:  # noqa: BLE001 - an unreadable announcement directory, a broken token file
        logging.getLogger("mneme.tune").warning("not reusing kept replay servers: %s", exc)
        return None


def dump_options(options: TuneOptions, path: str) -> None:
    """``--dump-config PATH``: YAML for .yml/.yaml, JSON otherwise; ``--config`` reads either back."""
    data = {k: v for k, v in options.to_dict().items() if k not in ("dump_config",)}
    target = Path(path)
    if target.suffix in (".yml", ".yaml"):
        import yaml

        text = yaml.safe_dump(data, sort_keys=False)
    else:
        text = dumps(data, indent=2) + "\n"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def _print_json(data: Any, out: TextIO) -> None:
    print(dumps(data, indent=2), file=out)


def baseline_document(config: ExperimentConfiguration, result: ExperimentResult, metric: str) -> dict[str, Any]:
    """``baseline.json``: the recorded launch's replay, its metric, the tolerance derived on it, and the GPU's
    conditions around it (``conditions``: clocks, temperature, power, throttle reasons; ``throttled``).

    Args:
        config: the baseline configuration.
        result: its replay's result.
        metric: ``--metric``.

    Returns:
        The document.
    """
    status = effective_status(result)
    times = result.measured_times
    return {
        "configuration": config.to_dict(),
        "hash": config.ground().hash(),
        "status": status,
        "verified": status == STATUS_VERIFIED,
        "metric": metric_value(times, metric) if status == STATUS_VERIFIED and times else None,
        "metric_name": metric,
        "result": result.to_dict(),
        "timestamp": now_iso(),
        "tolerance": derived_tolerance(result),
        "conditions": result.conditions,
        "throttled": result.throttled,
    }


def derived_tolerance(result: ExperimentResult) -> dict[str, Any]:
    """The bounds ``--tolerance auto`` derived on the baseline (what every trial is judged with), with
    their provenance and the baseline's nondeterminism report; empty policies when none was needed."""
    policies, provenance = {}, {}
    for label, entry in result.verified_within.items():
        if entry.get("source") == "auto":
            policies[label] = entry["policy"]
            provenance = entry.get("derived", provenance)
    return {"policies": policies, **({"provenance": provenance} if provenance else {}),
            "nondeterminism": result.nondeterminism}


class TuneRun:
    """The pieces of one run, wired together.

    Args:
        options: the run's settings.
        executor_factory: makes the replay executor (default: replay servers as the options say).
        instance_loader: reads the recording's instance (default: from the store).
        out: where tables and messages go (default: standard output).
        is_tty: whether ``out`` is a terminal (None: ask it).
    """

    def __init__(self, options: TuneOptions, *, executor_factory: ExecutorFactory | None = None,
                 instance_loader: InstanceLoader | None = None, out: TextIO | None = None,
                 is_tty: bool | None = None) -> None:
        self.options = options
        self.executor_factory = executor_factory or default_executor
        self.instance_loader = instance_loader or load_instance
        self.out = out or sys.stdout
        self.is_tty = is_tty
        self.log = logging.getLogger(f"mneme.tune.{id(self)}")
        self.log.propagate = False
        self._prestarted: PrestartedServers | None = None
        #: What the run wrote last: the results directory, summary.json's and best.json's documents, the
        #: tuned-kernels export (:meth:`json_summary`).
        self.results_path: Path | None = None
        self.summary: dict[str, Any] | None = None
        self.best: dict[str, Any] | None = None
        self.exported: Path | None = None

    # -- entry ---------------------------------------------------------------------------
    def run(self) -> int:
        """Run it: print the space or the plan, or tune and write the results directory.

        Returns:
            The exit status: 0 when the run finished, 1 when no candidate verified or a fail-fast stop ended it.
        """
        o = self.options
        if o.dump_config:
            dump_options(o, o.dump_config)
            print(f"wrote the resolved configuration to {o.dump_config}", file=self.out)
            return 0
        real_run = not (o.print_space or o.dry_run)
        if real_run:
            self._preflight()
            o = self.options  # --force may have moved the run beside its --results-dir
        # Local servers start now, while this process reads the recording and builds the space.
        self._prestarted = PrestartedServers(o) if real_run and not o.connection.servers and not o.servers_from \
            and getattr(self.executor_factory, "adopts_local_servers", False) else None
        try:
            kernel, identity = self.instance_loader(o.record_database, o.record_id)
            check_region_selectors(kernel, o.verification.overrides)
            mark("tune", "recording")
            if not o.record_id:  # the database's only instance: every later step uses its id
                o = self.options = dataclasses.replace(o, record_id=identity.record_id)
            space = build_space(o, kernel)
            baseline_config = baseline_checked(space)
            description = describe_space(space)
            mark("tune", "space")
            if o.print_space:
                _print_json(description, self.out)
                return 0
            if o.dry_run:
                _print_json({"baseline": baseline_config.to_dict(), "search_space": description,
                             "sampler": o.sampler, "trials": o.trials}, self.out)
                return 0
            if o.resume:  # the kernel and the space must be the run's in the directory
                self.options, moved = check_resumable(o, vars(identity), description)
                if moved:
                    print(moved, file=sys.stderr)
            with sigterm_as_interrupt():  # a batch system's time limit stops the run as Ctrl-C does
                return self._tune(space, description, identity)
        finally:
            if self._prestarted is not None:
                self._prestarted.discard()

    def json_summary(self) -> dict[str, Any] | None:
        """What ``mneme tune --json`` prints: the run's summary as one object.

        Returns:
            ``results_dir``; summary.json's keys (``trials``, ``verified``, ``failed``, ``by_status``,
            ``stopped``, ``best_speedup``, ...); ``best`` (best.json's best configuration, or null) and, for
            NSGA-II, ``pareto_front``; ``tuned_kernels``, the export written (or null). None when the run
            wrote no summary (``--print-space``, ``--dry-run``, an error before the results directory was ready).
        """
        if self.results_path is None or self.summary is None:
            return None
        best = self.best or {}
        return {"results_dir": str(self.results_path), **self.summary, "best": best.get("best"),
                **({"pareto_front": best["pareto_front"]} if "pareto_front" in best else {}),
                "tuned_kernels": str(self.exported) if self.exported is not None else None}

    def _preflight(self) -> None:
        """Before any server starts: the results directory can be written and holds what the run expects,
        and the ``--servers`` answer (those that do not are named; none answering ends the run)."""
        self.options, moved = choose_results_dir(self.options)
        if moved:
            print(moved, file=sys.stderr)
        o = self.options
        dials = getattr(self.executor_factory, "dials_servers", False)  # an executor of its own may not
        for line in check_servers(o.connection.servers) if o.connection.servers and dials else ():
            print(f"warning: {line}; going on with the other servers", file=sys.stderr)

    # -- a real run -----------------------------------------------------------------------
    def _tune(self, space: SearchSpace, description: dict[str, Any], identity: KernelIdentity) -> int:
        o = self.options
        results = ResultsDirectory(o.results_dir or default_results_dir(o.record_id))
        results.prepare(resume=o.resume)
        previous = results.load_trials() if o.resume else []
        handler = results.open_log(self.log)
        reporter = make_reporter(o.quiet, self.out, self.is_tty)
        # The driver the run measured with: `mneme run --apply` refuses the results under another one.
        config_doc = {**o.to_dict(), "results_dir": str(results.path), "kernel": vars(identity),
                      "device": {"driver_version": driver_version()},
                      "mneme_version": __version__, "written": now_iso(),
                      "fingerprint": run_fingerprint(o.to_dict(), vars(identity), description)}
        results.write_json("config.json", config_doc)
        results.write_json("search_space.json", description)
        self.log.info("tuning %s (%s) instance %s into %s", identity.name, identity.static_hash,
                      identity.record_id, results.path)
        state = LoopState(records=list(previous), done_hashes={r["hash"] for r in previous if r.get("hash")})
        baseline: dict[str, Any] | None = None
        started = time.monotonic()
        executor = strategy = None
        try:
            # The space's code variants compile on the servers' CPUs while they prepare and run the baseline.
            ahead = [] if o.baseline_only else code_variants(space)
            if self._prestarted is not None:
                executor = self.executor_factory(o, results.path, ahead, local_servers=self._prestarted.take())
                if self._prestarted.describe():
                    reporter.message(self._prestarted.describe())
            else:
                executor = self.executor_factory(o, results.path, ahead)
            mark("tune", "executor")
            baseline = self._baseline(space, executor, results, reporter)
            mark("tune", "baseline")
            if o.baseline_only:
                state.stopped = "baseline-only"
                return 0
            objective = o.objectives.with_baseline(baseline["metric"])
            strategy = make_strategy(space, o.sampler, seed=o.seed, directions=o.directions,
                                     study_name=o.study_name, storage=o.optuna_storage, pruner=o.pruner,
                                     results_dir=str(results.path), metric_names=objective.metric_names)
            if previous:
                strategy.seed_history(previous)
                reporter.message(f"resuming: {len(previous)} trials already in {results.path}")
            budget = max(0, o.trials - len(previous)) if o.trials is not None else None
            loop = TuningLoop(strategy=strategy, executor=executor, results=results, objective=objective,
                              reporter=reporter, log=self.log, state=state, budget=budget, timeout=o.timeout,
                              in_flight=in_flight(executor, o.workers),
                              fail_fast=o.fail_fast, adaptive_invalid_ban=o.adaptive_invalid_ban)
            total = o.trials if o.trials is not None else description.get("size")
            reporter.start(total)
            reporter.done = len(previous)
            try:
                loop.run()
            finally:
                reporter.finish()
            return self._conclude(state, baseline, results, identity, reporter)
        except KeyboardInterrupt:
            state.stopped = "interrupted"
            self.log.warning("interrupted; continue with --resume --results-dir %s", results.path)
            print(f"interrupted: {len(state.records)} trials are in {results.path}; continue with "
                  f"--resume --results-dir {results.path}", file=sys.stderr)
            raise
        finally:
            if executor is not None:
                mark("tune", "shutdown")
                executor.shutdown()
                mark("tune", "stopped")
            if strategy is not None:
                strategy.close()  # a shared study's running trials are released for other processes
            results.close()
            self.results_path = results.path
            self.best = best_document(state.records, baseline, o.sampler == "nsga2", objective=o.objectives)
            results.write_json("best.json", self.best)
            self.summary = summary_document(
                state.records, baseline, state=state, options=o.to_dict(),
                elapsed_s=time.monotonic() - started, space_size=description.get("size"),
                coverage=space_coverage(space, state.records, state.banned_blocks), objective=o.objectives)
            results.write_json("summary.json", self.summary)
            self.log.info("stopped: %s; %d trials", state.stopped, len(state.records))
            self.log.removeHandler(handler)
            handler.close()

    def _say_where(self, path: Path) -> None:
        """Where the results are (on standard error with --quiet: said in any case)."""
        print(f"results: {path} (plots: mneme tune report {path})", file=sys.stderr if self.options.quiet else self.out)

    def _baseline(self, space: SearchSpace, executor: Executor, results: ResultsDirectory,
                  reporter: Reporter) -> dict[str, Any]:
        o = self.options
        config = baseline_checked(space)
        if o.resume and not o.rerun_baseline:
            earlier = results.read_json("baseline.json")
            has_energy = ((earlier or {}).get("result") or {}).get("energy_j", -1) > 0
            if earlier and earlier.get("verified") and earlier.get("hash") == config.ground().hash() \
                    and earlier.get("metric_name") == o.metric and (has_energy or not o.measurement.energy):
                reporter.message(f"baseline (from the earlier run): {format_ns(earlier['metric'])}")
                self._judge_with(executor, earlier.get("tolerance") or {}, reporter)
                return earlier
        try:
            result = executor.evaluate(config)
        except Exception as exc:  # noqa: BLE001 - name the executor failure, keep the directory usable
            raise TuningError(
                f"the baseline replay failed in the executor: {type(exc).__name__}: {exc}; check the "
                "recording with `mneme replay` and the replay servers"
            ) from exc
        doc = baseline_document(config, result, o.metric)
        results.write_json("baseline.json", doc)
        self.log.info("baseline %s metric=%s", doc["status"], doc["metric"])
        if not doc["verified"]:
            raise baseline_failure(doc["status"], result.error)
        reporter.message(f"baseline: {format_ns(doc['metric'])} ({o.metric} of {len(result.measured_times)} launches)"
                         + (f", {result.energy_j:.4g} J per launch at {result.power_w:.4g} W" if result.energy_j > 0
                            else ""))
        self._check_measurement(result, reporter)
        self._check_counters(result, reporter)
        self._judge_with(executor, doc["tolerance"], reporter)
        return doc

    def _check_measurement(self, result: ExperimentResult, reporter: Reporter) -> None:
        """What the baseline says of the measurements: an energy objective the replays cannot measure is refused
        (exit status 2, with why: never ranked on zeros); a baseline measured while the GPU throttled, or without
        NVML, is said once."""
        o = self.options
        if o.measurement.energy and not result.energy_j > 0:
            raise NotAvailableError(
                f"--objective {o.objective} needs the GPU's energy, and the baseline's replay measured none: "
                f"{energy_missing_reason(result)}; tune for time instead (--objective time)")
        conditions = result.conditions or {}
        if conditions.get("unavailable"):
            reporter.message(f"note: the GPU's clocks and temperature are not recorded: {conditions['unavailable']}")
        elif result.throttled:
            reporter.message("note: the baseline was measured while the GPU throttled "
                             f"({', '.join(conditions.get('throttle_reasons') or [])}); see baseline.json's conditions")

    def _check_counters(self, result: ExperimentResult, reporter: Reporter) -> None:
        """The baseline's hardware counters (``--metrics``, a counter ``--objective``): shown; a counter the
        objective ranks by that could not be collected (a host that refuses the profiler) stops the run with
        the reason (exit status 2: never ranked on nothing)."""
        o = self.options
        if not o.counters:
            return
        if result.metrics:
            reporter.message("baseline counters: " + ", ".join(f"{k}={v:.6g}" for k, v in result.metrics.items()))
        missing = [n for n in counter_names(o.objective) if n not in result.metrics]
        if missing:
            raise NotAvailableError(
                f"--objective {o.objective} needs the hardware counter {missing[0]}, and the baseline's replay "
                f"collected none: {result.metrics_error or 'the replay servers did not profile'}; record it with "
                "--metrics and tune for time instead (--objective time)")
        if result.metrics_error:
            reporter.message(f"note: hardware counters: {result.metrics_error}")

    def _judge_with(self, executor: Executor, tolerance: dict[str, Any], reporter: Reporter) -> None:
        """Under ``--tolerance auto``: every trial is judged with the bounds derived once on the baseline
        (sent to the servers as explicit policies, so no worker derives its own). The user's explicit
        policies (``--tolerance SEL=SPEC``) went with every request from the start and win over both."""
        verification = self.options.verification
        explicit = verification.overrides
        if explicit:
            given = ", ".join(f"{label}={spec if isinstance(spec, str) else json.dumps(spec)}"
                              for label, spec in explicit.items())
            reporter.message(f"tolerance: explicit policies (win over annotations and derived bounds): {given}")
        if verification.mode != "auto":
            return
        policies = tolerance.get("policies") or {}
        if policies:
            runs = (tolerance.get("provenance") or {}).get("runs", "?")
            bounds = ", ".join(f"{label}={spec}" for label, spec in policies.items())
            reporter.message(f"tolerance: derived from {runs} runs of the baseline: {bounds} (see baseline.json)")
        else:
            reporter.message("tolerance: the baseline is deterministic; trials must verify bit-exactly")
        set_verification = getattr(executor, "set_verification", None)
        if set_verification is not None and policies:  # none needed: the prepared `auto` instance judges exactly
            set_verification(verification.with_(mode="exact", derived=policies))

    def _conclude(self, state: LoopState, baseline: dict[str, Any], results: ResultsDirectory,
                  identity: KernelIdentity, reporter: Reporter) -> int:
        o = self.options
        document = best_document(state.records, baseline, o.sampler == "nsga2", objective=o.objectives)
        best = document.get("best")
        counts = state.counts()
        exactness = verification_counts(state.records)
        reporter.message(
            f"{len(state.records)} trials ({counts.get('verified', 0)} verified: {exactness['verified_exact']} "
            f"exactly, {exactness['verified_within_tolerance']} within tolerance), stopped: {state.stopped}"
        )
        if best is None and o.optuna_storage and not state.records and state.stopped == "exhausted":
            # A shared study whose other processes claimed every configuration first: nothing failed here.
            reporter.message(f"the other processes of study {o.study_name} evaluated every configuration; "
                             f"see mneme tune report --optuna-storage {o.optuna_storage} --study-name {o.study_name}")
            self._say_where(results.path)
            return 0
        if best is None:
            reporter.message("no candidate configuration verified; see trials.jsonl for the reasons")
            self._say_where(results.path)
            return 1
        energy = f" energy={best['energy_j']:.4g} J/launch" if best.get("energy_j") else ""
        self.log.info("best: trial %s, %s=%s, speedup %.3f%s: %s", best["trial"], o.metric, format_ns(best["metric"]),
                      best["speedup"], energy, json.dumps(best["params"]))
        if not o.quiet and document.get("pareto_front"):
            names = o.objectives.metric_names
            render_top_table(pareto_rows(document["pareto_front"], baseline["metric"]), baseline["metric"], o.metric,
                             self.out, is_tty=self.is_tty, extra_headers=names[1:],
                             title=f"Pareto front ({', '.join(names)}) against the baseline")
        elif not o.quiet:
            render_top_table(top_configurations(state.records, baseline["metric"]), baseline["metric"], o.metric,
                             self.out, is_tty=self.is_tty, title="best configurations against the baseline")
        if best.get("overlaps_baseline"):
            reporter.message("note: the best's confidence interval overlaps the baseline's: with these launches the "
                             "two are not told apart (best.json's spread; more --iterations narrow it)")
        throttled = sum(1 for r in state.records if ((r.get("result") or {}).get("conditions") or {}).get("throttled"))
        if throttled:
            reporter.message(f"note: {throttled} trial(s) were measured while the GPU throttled (summary.json's "
                             "throttled_trials; each result's conditions say which)")
        self._say_where(results.path)
        export = o.proteus_path(results.path)
        if export is not None:
            write_export(export, identity, best, o.to_dict())
            self.exported = export
            self.log.info("wrote the tuned-kernels export %s", export)
        return 1 if state.stopped == "fail-fast" else 0


def in_flight(executor: Any, workers: int) -> int:
    """Candidates the loop keeps submitted: as many as the servers hold at once (the executor's
    ``capacity``: each worker's configurations in hand and the next ones queued behind them), so that
    the servers never wait for the sampler, which asks for the next candidates while they replay;
    executors that do not say, two per worker. A study shared with other processes too: each
    candidate's configuration is claimed study-wide when it is asked.

    Args:
        executor: the run's executor.
        workers: the run's ``--workers``.

    Returns:
        The number of candidates in flight.
    """
    capacity = getattr(executor, "capacity", None)
    return max(1, int(capacity)) if isinstance(capacity, int) else 2 * max(1, workers)


def baseline_failure(status: str, error: str) -> TuningError:
    """Why the run stops when its baseline did not verify: the servers could not be reached (the
    executor gave up on them), or the replay of the recorded launch itself is broken."""
    if error.startswith(SERVERS_LOST):
        return ServersUnreachableError(
            f"the baseline could not be replayed: {error}. The replay servers, not the recording, failed: "
            "check --servers (or the local servers' log) and run again")
    return TuningError(
        f"the baseline (recorded launch) did not verify: status {status}{': ' + error if error else ''}; "
        "the replay itself is broken, so no candidate could be trusted. Check it with `mneme replay` "
        "(see baseline.json)")


#: How the executor's result for a configuration no server answered begins (replay_server.client.executor).
SERVERS_LOST = "replay server lost"


def run_tune(options: TuneOptions, **kwargs: Any) -> int:
    """Run ``mneme tune`` with resolved options (``tuner.options.resolve_options``).

    Args:
        options: the run's settings.
        **kwargs: ``TuneRun``'s keyword arguments (``executor_factory``, ``instance_loader``, ``out``, ``is_tty``).

    Returns:
        The exit status: 0 when the run finished, 1 when no candidate verified or a fail-fast stop ended it.

    Raises:
        MnemeError: the run could not start or its baseline failed (``TuningError``, ``ConfigurationError``,
            ``NotAvailableError``).
    """
    return TuneRun(options, **kwargs).run()
