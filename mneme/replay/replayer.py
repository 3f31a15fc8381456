"""``Replayer``: one recorded kernel instance, restored on a GPU, replayed under configurations.

The facade over the replay's parts: the memory restored and reset
(``state.DeviceState``), the code compiled, loaded and launched
(``launch.Launcher``), the one-time proof and bounds (``readiness.Readiness``),
the comparisons and the verdict (``judge``); ``run`` puts them in order and
reports an ``ExperimentResult``. ``run`` never raises for what a configuration
does wrong; it returns a failed result with a status. A fault that destroys
the CUDA context (illegal address, trap, a kernel that never ends) leaves the
Replayer unhealthy: the process must be replaced, which is what the replay
server's worker processes are for.
"""

from __future__ import annotations

import datetime as _dt
import time
import traceback
from collections.abc import Sequence
from typing import Any

from mneme._internal.startup_trace import mark
from mneme.errors import ConfigurationError, MnemeError
from mneme.model.experiment import (
    STATUS_FAILED_VERIFICATION,
    STATUS_INTERNAL_ERROR,
    STATUS_INVALID_CONFIG,
    STATUS_RUNTIME_ERROR,
    STATUS_VERIFIED,
    ExperimentConfiguration,
    ExperimentResult,
)
from mneme.model.measurement import MeasurementSettings
from mneme.model.verification import ResetDecision, VerificationSettings
from mneme.replay import engine as eng
from mneme.replay import judge
from mneme.replay.compile import CompiledCode, CompileOptions
from mneme.replay.engine import device_arch
from mneme.replay.launch import Launcher, LaunchSettings, LoadedCode, RunFailure, measurements
from mneme.replay.launch_attrs import LaunchPlan, plan_for
from mneme.replay.measurement import Measurer
from mneme.replay.metrics import CounterProfiler, parse_metric_names
from mneme.replay.nondeterminism import DerivedTolerance
from mneme.replay.readiness import RESET_POLICIES, Readiness
from mneme.replay.state import DeviceState, heap_relocation
from mneme.replay.tolerance import judged_overrides

__all__ = ["Replayer", "ReplayBatch", "RESET_POLICIES", "device_arch", "BatchLost"]


class BatchLost(Exception):
    """The CUDA context was lost inside an engine call shared by several configurations
    (:meth:`Replayer.run_many`): which configuration did it is not known. The process must be
    replaced and each configuration replayed alone.
    """


class ReplayBatch:
    """Configurations whose launches were enqueued together (:meth:`Replayer.start_many`)."""

    def __init__(self, replayer: "Replayer", results: list, planned: list, handle: Any, before: Any = None,
                 alone: bool = False, later: Any = None) -> None:
        self._replayer, self._results, self._planned, self._handle = replayer, results, planned, handle
        self._before = before  # the measurer's reading before the launches
        self._alone = alone  # the driver refused the shared call: each planned one replays by itself
        self._later = later  # the replays not enqueued: made by results() (a callable giving the results)
        self._done = False

    @property
    def enqueued(self) -> bool:
        """Whether this batch's GPU work is all enqueued already, so that :meth:`results` waits only for it
        (and for what was enqueued before it). False when ``results`` replays configurations itself (one
        alone, a group the engine cannot share a call for, a shared call the driver refused): work enqueued
        after this batch would then come first, so take these results before enqueuing anything more.

        Returns:
            Whether work can be enqueued behind this batch before its results are taken.
        """
        return self._later is None and not (self._alone and self._planned)

    def ready(self) -> bool:
        """Whether :meth:`results` would not wait for the GPU.

        Returns:
            True once the GPU is done with the batch (or it failed).
        """
        handle = self._handle
        return handle is None or not hasattr(handle, "done") or bool(handle.done())

    def results(self, enqueued_behind: bool = False) -> list[ExperimentResult | None]:
        """Wait for the GPU and judge each configuration (once).

        Args:
            enqueued_behind: work was enqueued on the GPU after this batch (the next batch): a configuration
                whose verdict needs GPU work of its own (one that did not verify is replayed alone, for
                the bytes its report reads back and the resets it may need; or the shared call failed
                without losing the context) is not judged here, where that work would wait for what is
                enqueued behind (a kernel there that hangs would hold this batch's results): its entry is
                None, and it is to be replayed alone with nothing enqueued behind it.

        Returns:
            One result per request, in their order (None: see ``enqueued_behind``).

        Raises:
            BatchLost: the shared engine call destroyed the CUDA context (which configuration did it is not
                known: replay each alone in a fresh process).
        """
        if self._done:
            return self._results
        replayer, results, planned = self._replayer, self._results, self._planned
        self._done = True
        if self._later is not None:
            self._results = self._later()
            return self._results
        outs: list[Any] = []
        if planned and self._handle is not None:
            try:
                outs = replayer._launcher.wait_batch(self._handle)
            except Exception as exc:
                replayer._batch_failed(exc, len(planned))
                self._alone = True
            finally:
                self._handle = None
        for position, (index, one) in enumerate(planned):
            try:
                if self._alone and enqueued_behind:
                    results[index] = None  # its own replay would come after the work behind it
                    continue
                # Each alone (the driver refused the shared call), judged before the next one's launches.
                out = replayer._alone(one) if self._alone else outs[position]
                if isinstance(out, RunFailure):
                    results[index] = one.failure(out)
                else:
                    results[index] = replayer._conclude(one, out, self._before, fresh=self._alone,
                                                        alone_now=not enqueued_behind)
            except _NeedsAlone:
                results[index] = None
            except Exception as exc:
                results[index] = replayer._internal_error(exc, one.base)
        return results


class _NeedsAlone(Exception):
    """A batched configuration's verdict needs a replay of its own, which is not made now (work is enqueued
    behind its batch: the replay would wait for it)."""


class _Planned:
    """A configuration ready to launch: its code loaded, its launch checked, its comparisons planned."""

    __slots__ = ("config", "launches", "warmup", "loaded", "checks", "resets_each_launch", "base", "measured")

    def __init__(self, config: ExperimentConfiguration, launches: int, warmup: int, loaded: LoadedCode,
                 checks: judge.CheckPlan, resets_each_launch: bool, base: dict, measured: dict) -> None:
        self.config, self.launches, self.warmup, self.loaded = config, launches, warmup, loaded
        self.checks, self.resets_each_launch, self.base, self.measured = checks, resets_each_launch, base, measured

    def failure(self, failure: RunFailure) -> ExperimentResult:
        """The failed result of this configuration's replay."""
        return ExperimentResult.failure(failure.status, failure.error, end_time=_now(), **self.base, **self.measured,
                                        **failure.fields)  # fmt: skip


_second_text: tuple[int, str] = (-1, "")  # the last whole second's date and time (UTC), reused within it


def _now() -> str:
    """``datetime.now(timezone.utc).isoformat()``, the text of a result's start and end: the date and time
    of day made once per second (two per configuration)."""
    global _second_text
    now = time.time_ns()
    second, micros = divmod(now // 1000, 1_000_000)
    cached, text = _second_text
    if second != cached:
        text = _dt.datetime.fromtimestamp(second, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        _second_text = (second, text)
    return f"{text}.{micros:06d}+00:00" if micros else f"{text}+00:00"


class Replayer:
    """A recorded instance restored on ``device``, ready to run configurations.

    Attributes:
        recording: the recording.
        instance: the replayed instance.
        ctx: the engine's context on the GPU; ``arch`` its architecture (``sm_90``).
        launch_plan: the recorded launch attributes every launch repeats (replaceable: a test
            launches without them).
        overrides: the policies that win over the recorded annotations (from ``verification``).
        last_timing: the last replay's timing (:meth:`mneme.replay.launch.Launcher.timing`).
        last_profile: the last hardware counters' chip, raw metric by name, profiler passes and the group
            members the chip lacks (:meth:`collect_metrics`).
    """

    def __init__(
        self,
        recording: Any,
        record_id: str,
        device: int = 0,
        *,
        verification: VerificationSettings | None = None,
        compile_options: CompileOptions | None = None,
        queue_ahead: bool = True,
        l2_scrub: bool = False,
        timing: str = "events",
        timeout_s: float = 0.0,
        reset: str = "auto",
        store_tolerance: bool = True,
        reset_decision: ResetDecision | None = None,
        measurement: MeasurementSettings | None = None,
    ):
        """Restore ``recording[record_id]`` on ``device``.

        The recorded launch attributes (cluster dimensions, cooperative...) are repeated on every
        launch; one that cannot be is a NotAvailableError naming it.

        Args:
            recording: the :class:`mneme.recording.execution.RecordedExecution`.
            record_id: the instance's dynamic hash.
            device: the GPU's index.
            verification: how replays verify (:class:`mneme.model.verification.VerificationSettings`:
                tolerance mode, baseline runs, overrides, relocation, every launch or first and last).
                With ``mode="auto"`` the regions the baseline's own runs show to be nondeterministic
                are judged with bounds derived from that spread, read from the recording's
                ``<static>.tolerance.json`` when it holds them and written there otherwise
                (``store_tolerance``). In either mode a baseline that does not verify is replayed
                ``runs`` times to say which regions are nondeterministic (``result.nondeterminism``).
                ``relocate``: None restores heap buffers at their recorded addresses and moves them,
                as a reported fallback (``relocation_reason``), only where those cannot be had or the
                recording is relocatable; False raises RelocationRefusedError instead; True moves them.
            compile_options: replay-time compile settings (register cap).
            queue_ahead: keep the GPU busy while the launches are enqueued, so that the events time
                the kernel rather than the host.
            l2_scrub: read a scratch buffer after the resets so that the kernel does not start with
                an L2 full of the reset's dirty lines (off: it overshoots, leaving every line clean, and
                lands further from the in-application time; bench/replay_fidelity.py).
            timing: ``events`` (CUDA events around each launch) or ``cupti`` (CUPTI activity records
                of the kernel itself).
            timeout_s: when > 0, bounds each run's wait for the GPU (a kernel still running then
                makes the Replayer unhealthy).
            reset: ``auto`` (reset the written memory before every launch, unless the instance is
                proven idempotent: then only before each configuration's first launch) or ``always``.
            store_tolerance: write derived ``auto`` bounds beside the recording.
            reset_decision: the reset policy as a proof made elsewhere decided it (another process, after
                this one's proof lost its context; a cached verdict): no proof is made here.
            measurement: what replays measure besides times (:class:`mneme.model.measurement.MeasurementSettings`):
                the GPU's conditions around the launches are read in any case where NVML is there; with
                ``energy``, a verified replay also runs an energy window (``energy_j``, ``power_w``).
        """
        eng.require_driver()  # no GPU here: say so before reading anything
        if reset not in RESET_POLICIES:
            raise ConfigurationError(f"reset={reset!r}: use one of {', '.join(RESET_POLICIES)}")
        verification = verification or VerificationSettings()
        self.verification = verification
        self.recording = recording
        self.instance = recording[record_id]
        self.instance.require_supported()  # a launch the recorder could not capture: its reasons, not a CUDA fault
        self.launch_plan = plan_for(getattr(self.instance, "launch_attributes", ()))
        self.reset = reset
        self.tolerance = verification.mode
        self.tolerance_runs = verification.runs
        self.tolerance_safety = verification.safety
        self.store_tolerance = store_tolerance
        self.record_id = str(record_id)
        self.device = int(device)
        self.compile_options = compile_options or CompileOptions()
        self.verify_every_iteration = verification.every_iteration
        settings = LaunchSettings(queue_ahead=queue_ahead, l2_scrub=l2_scrub, timing=timing, timeout_s=timeout_s)
        self.queue_ahead, self.l2_scrub, self.timing, self.timeout_s = (
            settings.queue_ahead, settings.l2_scrub, settings.timing, settings.timeout_s)  # fmt: skip
        self.overrides = judged_overrides(verification)
        self.measurement = measurement or MeasurementSettings()
        self.last_timing: dict[str, Any] = {}
        self.last_profile: dict[str, Any] = {}  # the last counters' chip, raw names and passes
        self._profiler: CounterProfiler | None = None
        self._state: DeviceState | None = None
        self._launcher: Launcher | None = None
        self.ctx = eng.open_context(self.device)
        mark("replayer", "context")
        self.arch = device_arch(self.ctx)
        self._measurer = Measurer(self.device, self.measurement)  # (NVML is initialized by the first run)
        prologue = self.instance.load_prologue()
        epilogue = self.instance.load_epilogue()
        mark("replayer", "snapshots")
        relocate, relocate_reason = heap_relocation(verification.relocate, recording.address_space.mode)
        try:
            self._state = DeviceState(
                self.ctx, recording.store, prologue, epilogue, relocate=relocate, relocate_reason=relocate_reason,
                textures=getattr(self.instance, "textures", ()),  # recreated, their new handles written
            )
        except Exception:
            self.close()
            raise
        mark("replayer", "restored")
        self._launcher = Launcher(self.ctx, self.arch, recording, self.instance, self._state, settings,
                                  self.compile_options)  # fmt: skip
        self._readiness = Readiness(self._launcher, self.baseline(), self.overrides, verification, reset,
                                    store_tolerance, self.record_id, reset_decision,
                                    getattr(self.instance, "app_kernel_time_ns", None))  # fmt: skip
        unused = self.overrides.unused_selectors((r.name, r.recorded_base) for r in self._state.regions)
        if unused:
            names = ", ".join(r.label for r in self._state.regions)
            self.close()
            raise ConfigurationError(
                f"tolerance override(s) {', '.join(unused)} match no recorded region; regions are: {names}"
            )

    # -- public --------------------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        """Whether this Replayer can run: false once a fault destroyed the CUDA context, or after ``close``."""
        return self._launcher is not None and self._launcher.healthy

    @property
    def relocated(self) -> bool:
        """Whether recorded addresses were moved (heap relocated, or pointers to globals rewritten)."""
        return bool(self._state and (self._state.relocated_heap or self._state.has_pointer_sites))

    @property
    def relocated_heap(self) -> bool:
        """Whether heap buffers live elsewhere than at their recorded addresses (``result.relocated``)."""
        return bool(self._state and self._state.relocated_heap)

    @property
    def relocation_reason(self) -> str:
        """Why heap buffers are not at their recorded addresses ('' when they are)."""
        return self._state.relocation_reason if self._state else ""

    @property
    def idempotent(self) -> bool | None:
        """Whether the baseline proved idempotent (None: not tried yet, or ``reset='always'``)."""
        return self._readiness.idempotent

    @property
    def derived(self) -> DerivedTolerance | None:
        """The bounds ``tolerance='auto'`` judges with (stored or derived here; None: none yet)."""
        return self._readiness.derived

    @property
    def derived_stored(self) -> str:
        """Where ``derived`` was read from or written to ('' before it is settled)."""
        return self._readiness.derived_stored

    @property
    def probe_error(self) -> str:
        """Why the baseline's repeated runs could not run ('' when they could, or were not made)."""
        return self._readiness.probe_error

    @property
    def device_bytes(self) -> int:
        """Device memory this Replayer holds (state copies, window mappings; modules not counted)."""
        return self._state.device_bytes if self._state else 0

    @property
    def regions(self) -> list[Any]:
        """The recorded regions and their device copies (``state.RegionState``)."""
        return list(self._state.regions) if self._state else []

    def baseline(self) -> ExperimentConfiguration:
        """The recorded launch as a configuration (runs the recorded cubin unchanged).

        Returns:
            The configuration.
        """
        return ExperimentConfiguration(
            grid=self.instance.grid_dim, block=self.instance.block_dim, shared_mem=self.instance.shared_mem
        )

    def compile(self, config: ExperimentConfiguration) -> CompiledCode:
        """The code ``config`` runs on this GPU (CPU work; cached by content).

        Args:
            config: the configuration.

        Returns:
            The compiled code.
        """
        return self._launcher.compile(config)

    def uses_resets(self) -> bool:
        """Whether launches after a configuration's first reset the written memory.

        With ``reset='auto'`` the first call proves idempotence once for this
        instance: the baseline runs twice without a reset between, and both
        launches must match the epilogue. An idempotent kernel then skips the
        per-launch copies (the largest cost of a replayed launch, which also leaves
        an L2 full of the copy's dirty lines that the application's kernel does
        not see); the checked launches still compare with the
        epilogue, and a configuration whose first launch verifies but a later
        one (on what the previous launch left) does not is run again with the
        resets (``run``). With ``tolerance='auto'`` the bounds are settled first
        (``mneme.replay.readiness``).

        Returns:
            True when every launch is reset.
        """
        return self._readiness.uses_resets(self.launch_plan)

    def reset_decision(self) -> ResetDecision | None:
        """What this replayer's proof decided, for the process that replays the instance next (after a
        proof that lost the context: resets before every launch, and why).

        Returns:
            The decision; None when none was made yet.
        """
        return self._readiness.decision()

    def fallback(self) -> ResetDecision | None:
        """The reset decision to replay with in a fresh process, when this one's proof lost its CUDA
        context on a second launch without a reset (the kernel is not idempotent); None otherwise.

        Returns:
            The decision (resets before every launch, and why), or None.
        """
        decision = self._readiness.decision()
        return decision if (self._readiness.failure and decision is not None and decision.each_launch) else None

    @property
    def kernel_ns(self) -> int | None:
        """The kernel's time: measured by the proof's first launch, else as the application recorded it."""
        return self._readiness.measured_ns or getattr(self.instance, "app_kernel_time_ns", None) or None

    def get_ready(self) -> str:
        """Do now the one-time work that the first configuration would otherwise pay for (the reset
        policy's proof: two launches of the recorded baseline, ``uses_resets``), so that it is not
        counted in any configuration's time.

        Returns:
            '' when this Replayer can run; otherwise why it cannot (the proof lost the CUDA context:
            drop this Replayer and replace the process).
        """
        self.uses_resets()
        return "" if self.healthy else self._readiness.unusable()[1]

    def probe(self) -> DerivedTolerance | None:
        """Replay the baseline ``runs`` times and classify every region (once).

        Returns:
            The findings and their bounds; None when the baseline cannot run here (``probe_error``).
        """
        return self._readiness.probe(self.launch_plan)

    def run(
        self,
        config: ExperimentConfiguration,
        iterations: int = 3,
        warmup: int = 2,
        compiled: CompiledCode | None = None,
        metrics: Sequence[str] = (),
    ) -> ExperimentResult:
        """Replay ``warmup + iterations`` launches under ``config``; verify; report. Never raises.

        Args:
            config: the configuration.
            iterations: timed launches (at least 1).
            warmup: launches before them (at least 0), reported first in ``exec_time``.
            compiled: ``config``'s code compiled elsewhere (a server's compile pool); None compiles here.
            metrics: hardware counters to collect after the timed launches (curated or raw CUPTI names,
                :mod:`mneme.replay.metrics`): ``result.metrics``, or ``result.metrics_error`` saying why not.

        Returns:
            The result; a failed one (``status``, ``error``) for a configuration that cannot run.
        """
        base = self._base(warmup)
        try:
            result = self._run(config, int(iterations), int(warmup), compiled, base)
            if metrics:
                try:
                    result.metrics, result.metrics_error = self.collect_metrics(config, metrics, result, compiled)
                except Exception as exc:  # a bug of ours: the replay's own result stands
                    result.metrics_error = f"internal error collecting hardware counters: {type(exc).__name__}: {exc}"
            return result
        except Exception as exc:  # a bug of ours, not the configuration's: say so, keep going
            return self._internal_error(exc, base)

    def run_many(
        self, requests: "list[tuple[ExperimentConfiguration, int, int, CompiledCode | None]]"
    ) -> list[ExperimentResult]:
        """Replay several configurations, each as :meth:`run` would, with their launches in one engine call
        where the engine has one: ``start_many(requests).results()``.

        Args:
            requests: (configuration, iterations, warmup, compiled code or None) per configuration.

        Returns:
            One result per request, in their order.

        Raises:
            BatchLost: the shared engine call destroyed the CUDA context (see :meth:`start_many`).
        """
        return self.start_many(requests).results()

    def start_many(
        self, requests: "list[tuple[ExperimentConfiguration, int, int, CompiledCode | None]]"
    ) -> "ReplayBatch":
        """Enqueue the launches of several configurations in one engine call (``Context.start_batch``) and
        return without waiting for the GPU: the caller can prepare and enqueue the next batch while this
        one runs, then take this one's results (:meth:`ReplayBatch.results`). The configurations run back
        to back on the GPU with no host work between them. Each result is the one :meth:`run` gives; a
        configuration that does not verify is replayed again alone, for the bytes its report reads back
        (the memory then holds a later configuration's output). Without such an engine call (or with
        CUPTI timing, an L2 scrub, or recorded pointers to rewrite per module), or for one configuration,
        each runs as :meth:`run` when the results are taken (``ReplayBatch.enqueued`` is then False: take
        the results of the batches started before first, and enqueue nothing behind it).

        Args:
            requests: (configuration, iterations, warmup, compiled code or None) per configuration.

        Returns:
            The batch; its ``results()`` are in the order of ``requests``.

        Raises:
            BatchLost: enqueueing destroyed the CUDA context (``results()`` raises it too when the GPU work did).
        """
        if len(requests) < 2 or not self._batchable():
            # Replayed one by one by results(), not now: the caller takes the results of what is enqueued
            # before (they must not wait for these replays), then these (``ReplayBatch.enqueued`` is False).
            requests = list(requests)
            return ReplayBatch(self, [], [], None, later=lambda: [
                self.run(c, iterations, warmup, compiled) for c, iterations, warmup, compiled in requests])
        results: list[Any] = []
        planned: list[tuple[int, _Planned]] = []
        for index, (config, iterations, warmup, compiled) in enumerate(requests):
            base = self._base(warmup)
            try:
                one = self._plan(config, int(iterations), int(warmup), compiled, base)
            except Exception as exc:  # a bug of ours: as run() says it
                one = self._internal_error(exc, base)
            results.append(one)
            if isinstance(one, _Planned):
                planned.append((index, one))
        if not planned:
            return ReplayBatch(self, results, [], None)
        launcher, state, plan = self._launcher, self._state, self.launch_plan
        items = []
        for _, one in planned:
            homes = one.loaded.global_homes
            items.append(launcher.batch_item(
                one.loaded, one.config, one.launches, plan, before=state.full_reset_copies(homes),
                resets=state.iteration_resets(homes) if one.resets_each_launch else [], checks=one.checks.checks,
                check_launches=judge.checked_launches(one.launches, self.verify_every_iteration)))
        before = self._measurer.before()
        try:
            handle = launcher.start_batch(items)
        except Exception as exc:
            self._batch_failed(exc, len(items))  # the context lost: BatchLost; a bug of ours: raised
            return ReplayBatch(self, results, planned, None, before, alone=True)
        return ReplayBatch(self, results, planned, handle, before)

    def _batchable(self) -> bool:
        """Whether configurations can share an engine call: the engine has one, launches are timed with
        events without an L2 scrub, no recorded pointer needs rewriting per module, no CUDA array needs
        filling (its full reset is no device copy of the engine call), and no energy window follows each
        replay (it must have the GPU to itself, not share it with the next group)."""
        return (hasattr(self.ctx, "start_batch") and self.timing == "events" and not self.l2_scrub
                and not self.measurement.energy and self._state is not None and not self._state.has_pointer_sites
                and not self._state.has_arrays)

    def _batch_failed(self, exc: Exception, count: int) -> None:
        """An engine call shared by ``count`` configurations raised ``exc``: BatchLost when it destroyed the
        context, ``exc`` itself when it is not a driver error; else the driver refused it (each is then
        replayed alone)."""
        code_no = self._launcher.driver_failure(exc)  # a bug of ours (not a driver error) propagates
        if code_no in eng.CONTEXT_DESTROYING:
            raise BatchLost(f"the CUDA context was lost in an engine call of {count} configurations ({exc}); "
                            "each is replayed alone in a fresh process") from None

    def _alone(self, one: "_Planned") -> "dict | RunFailure":
        """``one``'s launches in an engine call of its own (after the batches enqueued before it)."""
        try:
            return self._launch(one.loaded, one.config, one.launches, self.launch_plan, one.checks,
                                one.resets_each_launch)  # fmt: skip
        except RunFailure as failure:
            return failure

    def _base(self, warmup: int) -> dict:
        return {
            "gpu_id": self.device,
            "start_time": _now(),
            "warmup": max(int(warmup), 0),
            "relocated": self.relocated_heap,
            "relocation_reason": self.relocation_reason,
        }

    def _internal_error(self, exc: Exception, base: dict) -> ExperimentResult:
        return ExperimentResult.failure(
            STATUS_INTERNAL_ERROR,
            f"internal error in the replay engine: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}",
            end_time=_now(),
            **base,
        )

    def collect_metrics(
        self, config: ExperimentConfiguration, metrics: Sequence[str], result: ExperimentResult | None = None,
        compiled: CompiledCode | None = None,
    ) -> tuple[dict[str, float], str]:  # fmt: skip
        """Hardware counters of one launch of ``config``, profiled on its own (after, never during, timed
        launches: profiling perturbs timing): one launch per profiler pass, the memory reset from the
        recorded prologue and the L2 flushed before each pass (:meth:`Launcher.profile`).

        Args:
            config: the configuration.
            metrics: curated or raw CUPTI metric names (:func:`mneme.replay.metrics.parse_metric_names`).
            result: the configuration's replay, when made: counters are collected only when it ran to a
                verdict (verified or not).
            compiled: ``config``'s code compiled elsewhere; None compiles (or finds it loaded) here.

        Returns:
            (``{name: value}``, '') or ({}, why they could not be collected: an unknown metric, a host where
            the profiler cannot run, a replay that did not run).
        """
        if result is not None and result.status not in (STATUS_VERIFIED, STATUS_FAILED_VERIFICATION):
            return {}, f"not collected: the replay ended with status {result.status}"
        if not self.healthy:
            return {}, "not collected: this replayer's CUDA context is lost"
        try:
            names = parse_metric_names(metrics)
            loaded = self._launcher.prepare(config, compiled)
            self._launcher.check_launch(loaded, config, self.launch_plan)
            profiler = self._counter_profiler()
            values = profiler.collect(names, lambda metric_config: self._launcher.profile(
                loaded, config, self.launch_plan, metric_config))
        except (MnemeError, RunFailure) as exc:
            return {}, str(exc)
        except Exception as exc:
            if eng.cuda_error_code(exc) is None:
                raise
            self._launcher.driver_failure(exc)  # a fault that destroys the context makes the replayer unhealthy
            return {}, f"hardware counters: the profiled launch failed: {exc}"
        self.last_profile = dict(profiler.last)
        return values, ""

    def _counter_profiler(self) -> CounterProfiler:
        if self._profiler is None:
            self._profiler = CounterProfiler(self.ctx, eng.load_engine())
        return self._profiler

    def close(self) -> None:
        """Release device memory and modules; the Replayer cannot run afterwards."""
        if self._launcher is not None:
            self._launcher.close()
        if self._state is not None:
            try:
                self._state.close()
            except Exception:
                pass  # a destroyed context cannot free; the process is going away anyway
            self._state = None

    def __enter__(self) -> "Replayer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the replay -----------------------------------------------------------------------
    def _run(
        self, config: ExperimentConfiguration, iterations: int, warmup: int, compiled: CompiledCode | None, base: dict
    ) -> ExperimentResult:
        planned = self._plan(config, iterations, warmup, compiled, base)
        if isinstance(planned, ExperimentResult):
            return planned
        before = self._measurer.before()
        try:
            out = self._launch(planned.loaded, config, planned.launches, self.launch_plan, planned.checks,
                               planned.resets_each_launch)  # fmt: skip
        except RunFailure as failure:
            return planned.failure(failure)
        return self._conclude(planned, out, before)

    def _plan(
        self, config: ExperimentConfiguration, iterations: int, warmup: int, compiled: CompiledCode | None, base: dict
    ) -> "_Planned | ExperimentResult":
        """Everything before the launches: the checks of the request, the code loaded, the launch checks
        and the comparisons; a failed result when the configuration cannot run."""
        measured: dict[str, Any] = {}  # what the code gives, once loaded: failures after that carry it too
        launcher, plan = self._launcher, self.launch_plan
        try:
            self._check_request(config, iterations, warmup)
            resets_each_launch = self._settle_resets()  # the first run with reset='auto' proves idempotence
            loaded = launcher.prepare(config, compiled)
            measured = measurements(loaded.code, loaded)
            launcher.check_launch(loaded, config, plan)
            checks = self._checks(loaded)
        except RunFailure as failure:
            return ExperimentResult.failure(failure.status, failure.error, end_time=_now(), **base, **measured,
                                            **failure.fields)  # fmt: skip
        return _Planned(config, warmup + iterations, warmup, loaded, checks, resets_each_launch, base, measured)

    def _checks(self, loaded: LoadedCode) -> judge.CheckPlan:
        """The comparisons of a replay of ``loaded`` (made once per loaded code and bounds: the same for
        every configuration of one code variant)."""
        derived = self._readiness.derived
        cached = loaded.check_plan
        if cached is not None and cached[0] is derived:
            return cached[1]
        checks = judge.plan_checks(self._state, loaded.global_homes, self.overrides, derived)
        loaded.check_plan = (derived, checks)
        return checks

    def _conclude(self, planned: "_Planned", out: dict, before: Any, fresh: bool = True,
                  alone_now: bool = True) -> ExperimentResult:
        """The verdict of a replay whose launches gave ``out``: judged (a configuration right only from the
        recorded memory is replayed again with resets before every launch), its conditions (``before``:
        the measurer's reading before the launches) and energy window, reported. ``fresh``: the device
        memory still holds what these launches left (not so for a batch's configurations: a mismatch's
        report reads it back, so one that does not verify is replayed alone first; with ``alone_now``
        False that replay is not made here: _NeedsAlone)."""
        launcher, plan, config = self._launcher, self.launch_plan, planned.config
        loaded, checks, launches = planned.loaded, planned.checks, planned.launches
        resets_each_launch = planned.resets_each_launch
        try:
            # (not read back when not fresh: the memory holds a later configuration's output, and reading
            # it would wait for whatever is enqueued behind)
            found = judge.mismatches(checks, out, self._state, loaded.global_homes, read_back=fresh)
            if found and not fresh:
                if not alone_now:
                    raise _NeedsAlone()
                out = self._launch(loaded, config, launches, plan, checks, resets_each_launch)
                found = judge.mismatches(checks, out, self._state, loaded.global_homes)
            if found and not resets_each_launch and judge.first_launch_verified(found):
                resets_each_launch = True
                out = self._launch(loaded, config, launches, plan, checks, resets_each_launch)
                found = judge.mismatches(checks, out, self._state, loaded.global_homes)
            conditions = self._measurer.after(before)
            energy = {} if found else self._energy(loaded, config, plan, resets_each_launch, out, conditions)
        except RunFailure as failure:
            return planned.failure(failure)
        self.last_timing = launcher.timing(out, launches, resets_each_launch)
        nondeterminism, note = self._readiness.baseline_findings(config, found, plan)
        return ExperimentResult(
            exec_time=[int(t) for t in out["times_ns"]],
            executed=True,
            failed=False,
            end_time=_now(),
            reset_each_launch=resets_each_launch,
            reset_reason=self._reset_reason(resets_each_launch),
            conditions=conditions,
            **energy,
            **judge.verdict(checks, out, found, self._readiness.derived, nondeterminism, note),
            **planned.base,
            **planned.measured,
        )

    def _energy(self, loaded: LoadedCode, config: ExperimentConfiguration, plan: LaunchPlan, resets_each_launch: bool,
                out: dict, conditions: dict) -> dict[str, float]:
        """The energy window of a verified replay, when the measurement settings ask for one: the
        configuration's launches back to back (with the resets its replay needed, no comparisons),
        ``mneme.replay.measurement``; its details go to ``conditions["energy"]``. RunFailure for a launch
        that failed."""
        if not self.measurement.energy:
            return {}
        resets = self._state.iteration_resets(loaded.global_homes) if resets_each_launch else []

        def batch(launches: int) -> None:
            try:
                self._launcher.launch(loaded, config, launches, plan, resets=resets, checks=[], check_launches=[],
                                      timed=False, from_recorded=False)  # fmt: skip
            except Exception as exc:
                raise self._launcher.run_failure(exc) from None

        times = out["times_ns"]
        per_launch_ns = (out.get("gpu_span_ns") or out["wall_ns"]) / max(len(times), 1)
        reading = self._measurer.energy(batch, per_launch_ns / 1e9)
        conditions["energy"] = reading.details
        return {"energy_j": reading.energy_j, "power_w": reading.power_w}

    def _reset_reason(self, resets_each_launch: bool) -> str:
        """Why every launch of a replay was reset ('' when not)."""
        if not resets_each_launch:
            return ""
        if self._readiness.idempotent is False or self.reset == "always":
            return self._readiness.reset_reason
        return ("a later launch of this configuration, run on what the previous launch left, did not reproduce "
                "the recording (the recorded launch is idempotent)")

    def _check_request(self, config: Any, iterations: int, warmup: int) -> None:
        """RunFailure for a Replayer that cannot run, or a request that is not a valid configuration."""
        if not self.healthy or self._state is None:
            raise RunFailure(
                STATUS_RUNTIME_ERROR,
                "this replayer's CUDA context was destroyed by an earlier fault (or it was closed); "
                "open a new Replayer in a fresh process",
            )
        if not isinstance(config, ExperimentConfiguration):
            raise RunFailure(STATUS_INVALID_CONFIG, f"expected an ExperimentConfiguration, got {type(config).__name__}")
        errors = config.validation_errors()
        if iterations < 1:
            errors.append(f"iterations={iterations} must be at least 1")
        if warmup < 0:
            errors.append(f"warmup={warmup} must not be negative")
        if errors:
            raise RunFailure(STATUS_INVALID_CONFIG, "invalid configuration: " + "; ".join(errors))

    def _settle_resets(self) -> bool:
        """``uses_resets``; RunFailure when settling it lost the CUDA context."""
        resets_each_launch = self.uses_resets()
        if not self.healthy:
            status, error = self._readiness.unusable()
            raise RunFailure(status, error, executed=True)
        return resets_each_launch

    def _launch(
        self, loaded: LoadedCode, config: ExperimentConfiguration, launches: int, plan: LaunchPlan,
        checks: judge.CheckPlan, resets_each_launch: bool,
    ) -> dict:  # fmt: skip
        """One timed replay from a full reset, the written memory reset before every launch or not;
        RunFailure for a launch the driver refused or a kernel that failed."""
        resets = self._state.iteration_resets(loaded.global_homes) if resets_each_launch else []
        try:
            return self._launcher.launch(
                loaded, config, launches, plan, resets=resets, checks=checks.checks,
                check_launches=judge.checked_launches(launches, self.verify_every_iteration), timed=True,
            )  # fmt: skip
        except Exception as exc:
            raise self._launcher.run_failure(exc) from None
