"""``Replayer``: one recorded kernel instance, restored on a GPU, replayed under configurations.

The policy layer over the native engine: which code a configuration runs
(``compile.compile_for``), which memory is restored and reset
(``state.DeviceState``), what is compared and how (``tolerance``), and how
the outcome is reported (``ExperimentResult``). ``run`` never raises for what a
configuration does wrong; it returns a failed result with a status. A fault
that destroys the CUDA context (illegal address, trap, a kernel that never
ends) leaves the Replayer unhealthy: the process must be replaced, which is
what the replay server's worker processes are for.
"""

from __future__ import annotations

import datetime as _dt
import math
import traceback
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from mneme._internal.startup_trace import mark
from mneme.errors import (
    ArtifactError,
    ConfigurationError,
    MnemeError,
    NotAvailableError,
)
from mneme.model.experiment import (
    STATUS_COMPILE_ERROR,
    STATUS_FAILED_VERIFICATION,
    STATUS_INTERNAL_ERROR,
    STATUS_INVALID_CONFIG,
    STATUS_INVALID_LAUNCH,
    STATUS_RUNTIME_ERROR,
    STATUS_TIMEOUT,
    STATUS_VERIFIED,
    ExperimentConfiguration,
    ExperimentResult,
)
from mneme.model.verification import VerificationSettings
from mneme.replay import engine as eng
from mneme.replay.compile import CompiledCode, CompileError, CompileOptions, compile_for
from mneme.replay.launch_attrs import plan_for
from mneme.replay.nondeterminism import DerivedTolerance, summarize
from mneme.replay.state import DeviceState
from mneme.replay.tolerance import (
    deviation,
    engine_check,
    is_exact,
    judge,
    judged_overrides,
    worse,
)

#: Dynamic shared memory above this needs the kernel's opt-in attribute.
DEFAULT_DYNAMIC_SHARED_LIMIT = 48 * 1024
MODULE_CACHE_ENTRIES = 32
#: Reset policies: ``auto`` resets before every launch unless the instance is proven idempotent
#: (then only before each configuration's first launch); ``always`` resets before every launch.
RESET_POLICIES = ("auto", "always")
#: ``exact``: recorded annotations and overrides only; ``auto``: also bounds derived from the baseline's
#: own runs for the regions that are nondeterministic (``nondeterminism.py``).


@dataclass
class _LoadedCode:
    """A module loaded in this context, with what a launch of its kernel needs."""

    code: CompiledCode
    module: Any
    function: Any
    attributes: dict[str, int]
    global_homes: dict[int, int]  # recorded global base -> address in this module
    args: bytes  # the argument buffer with pointers translated for this module
    param_offsets: list[int]  # where each parameter starts in args (empty: pass args as one buffer)
    load_seconds: float  # the driver's module load, counted once: by the run that loaded it


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat()


def device_arch(ctx: Any) -> str:
    major, minor = ctx.compute_capability
    return f"sm_{major}{minor}"


class Replayer:
    """A recorded instance restored on ``device``, ready to run configurations."""

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
                an L2 full of the reset's dirty lines (off: bench/replay_fidelity.py measured it
                further from the in-application time).
            timing: ``events`` (CUDA events around each launch) or ``cupti`` (CUPTI activity records
                of the kernel itself).
            timeout_s: when > 0, bounds each run's wait for the GPU (a kernel still running then
                makes the Replayer unhealthy).
            reset: ``auto`` (reset the written memory before every launch, unless the instance is
                proven idempotent: then only before each configuration's first launch) or ``always``.
            store_tolerance: write derived ``auto`` bounds beside the recording.
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
        self.derived: DerivedTolerance | None = None  # what auto judges with (stored or derived here)
        self.derived_stored = ""  # where it was read from or written to
        self._probe: DerivedTolerance | None = None  # this Replayer's own runs of the baseline
        self._idempotent: bool | None = None
        self._proof_failure: tuple[str, str] | None = None  # (status, error) when the proof lost the context
        self.record_id = str(record_id)
        self.device = int(device)
        self.compile_options = compile_options or CompileOptions()
        self.verify_every_iteration = verification.every_iteration
        self.queue_ahead = queue_ahead
        self.l2_scrub = l2_scrub
        if timing not in ("events", "cupti"):
            raise ConfigurationError(f"timing={timing!r}: use 'events' or 'cupti'")
        if timing == "cupti":
            reason = eng.load_engine().cupti_unavailable_reason()
            if reason:
                raise NotAvailableError(f"CUPTI timing is not available here: {reason}; use timing='events'")
        self.timing = timing
        self.timeout_s = float(timeout_s)
        self.overrides = judged_overrides(verification)
        relocate = verification.relocate
        self.healthy = True
        self.last_timing: dict[str, Any] = {}
        self._modules: OrderedDict[str, _LoadedCode] = OrderedDict()
        self._state: DeviceState | None = None
        self._sources: dict[str, str] = {}
        self.probe_error = ""
        self.ctx = eng.open_context(self.device)
        mark("replayer", "context")
        self.arch = device_arch(self.ctx)
        prologue = self.instance.load_prologue()
        epilogue = self.instance.load_epilogue()
        mark("replayer", "snapshots")
        relocate_reason = "relocation was asked for (relocate=True)"
        if relocate is None and recording.address_space.mode == "relocatable":
            relocate, relocate_reason = True, (
                "the recording is relocatable: the recorder could not serve every allocation from its fixed window"
            )
        try:
            self._state = DeviceState(
                self.ctx, recording.store, prologue, epilogue, relocate=relocate, relocate_reason=relocate_reason
            )
        except Exception:
            self.close()
            raise
        mark("replayer", "restored")
        unused = self.overrides.unused_selectors((r.name, r.recorded_base) for r in self._state.regions)
        if unused:
            names = ", ".join(r.label for r in self._state.regions)
            self.close()
            raise ConfigurationError(
                f"tolerance override(s) {', '.join(unused)} match no recorded region; regions are: {names}"
            )

    # -- public --------------------------------------------------------------------------
    @property
    def relocated(self) -> bool:
        """Whether recorded addresses were moved (heap relocated, or pointers to globals rewritten)."""
        return bool(self._state and (self._state.relocated_heap or self._state.has_pointer_sites))

    @property
    def relocated_heap(self) -> bool:
        """Whether heap buffers live elsewhere than at their recorded addresses (``result.relocated``)."""
        return bool(self._state and self._state.relocated_heap)

    @property
    def idempotent(self) -> bool | None:
        """Whether the baseline proved idempotent (None: not tried yet, or ``reset='always'``)."""
        return self._idempotent

    def uses_resets(self) -> bool:
        """Whether launches after a configuration's first reset the written memory.

        With ``reset='auto'`` the first call proves idempotence once for this
        instance: the baseline runs twice without a reset between, and both
        launches must match the epilogue. An idempotent kernel then skips the
        per-launch copies (a kernel that writes 64 MiB paid 44 us per launch for
        them, and found an L2 full of the copy's dirty lines the application's
        kernel does not see); the checked launches still compare with the
        epilogue, and a configuration whose first launch verifies but a later
        one (on what the previous launch left) does not is run again with the
        resets (``_run``).
        """
        if self.tolerance == "auto" and self.derived is None:
            self._derive_tolerance()  # before the proof: its checks judge with the derived bounds
        if self.reset == "always":
            return True
        if self._idempotent is None:
            self._idempotent = self._prove_idempotent()
        return not self._idempotent

    def get_ready(self) -> str:
        """Do now the one-time work that the first configuration would otherwise pay for (the reset
        policy's proof: two launches of the recorded baseline, ``uses_resets``), so that it is not
        counted in any configuration's time. '' when this Replayer can run; otherwise why it cannot
        (the proof lost the CUDA context: drop this Replayer and replace the process)."""
        self.uses_resets()
        return "" if self.healthy else self._why_unusable()[1]

    def _why_unusable(self) -> tuple[str, str]:
        """(status, error) of a Replayer that is no longer healthy."""
        return self._proof_failure or (STATUS_RUNTIME_ERROR, "the CUDA context was lost")

    @property
    def relocation_reason(self) -> str:
        """Why heap buffers are not at their recorded addresses ('' when they are)."""
        return self._state.relocation_reason if self._state else ""

    @property
    def device_bytes(self) -> int:
        """Device memory this Replayer holds (state copies, window mappings; modules not counted)."""
        return self._state.device_bytes if self._state else 0

    @property
    def regions(self) -> list[Any]:
        return list(self._state.regions) if self._state else []

    def baseline(self) -> ExperimentConfiguration:
        """The recorded launch as a configuration (runs the recorded cubin unchanged)."""
        return ExperimentConfiguration(
            grid=self.instance.grid_dim, block=self.instance.block_dim, shared_mem=self.instance.shared_mem
        )

    def compile(self, config: ExperimentConfiguration) -> CompiledCode:
        """The code ``config`` runs on this GPU (CPU work; cached by content)."""
        return compile_for(self.recording, self.instance, config, self.arch, self.compile_options)

    def run(
        self,
        config: ExperimentConfiguration,
        iterations: int = 3,
        warmup: int = 2,
        compiled: CompiledCode | None = None,
    ) -> ExperimentResult:
        """Replay ``warmup + iterations`` launches under ``config``; verify; report. Never raises."""
        start = _now()
        base = {
            "gpu_id": self.device,
            "start_time": start,
            "warmup": max(int(warmup), 0),
            "relocated": self.relocated_heap,
            "relocation_reason": self.relocation_reason,
        }
        try:
            return self._run(config, int(iterations), int(warmup), compiled, base)
        except Exception as exc:  # a bug of ours, not the configuration's: say so, keep going
            return ExperimentResult.failure(
                STATUS_INTERNAL_ERROR,
                f"internal error in the replay engine: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}",
                end_time=_now(),
                **base,
            )

    def close(self) -> None:
        """Release device memory and modules; the Replayer cannot run afterwards."""
        self._modules.clear()
        if self._state is not None:
            try:
                self._state.close()
            except Exception:
                pass  # a destroyed context cannot free; the process is going away anyway
            self._state = None
        self.healthy = False

    def __enter__(self) -> "Replayer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the replay -----------------------------------------------------------------------
    def _run(
        self, config: ExperimentConfiguration, iterations: int, warmup: int, compiled: CompiledCode | None, base: dict
    ) -> ExperimentResult:
        def fail(status: str, error: str, **extra: Any) -> ExperimentResult:
            return ExperimentResult.failure(status, error, end_time=_now(), **base, **extra)

        if not self.healthy or self._state is None:
            return fail(
                STATUS_RUNTIME_ERROR,
                "this replayer's CUDA context was destroyed by an earlier fault (or it was closed); "
                "open a new Replayer in a fresh process",
            )
        if not isinstance(config, ExperimentConfiguration):
            return fail(STATUS_INVALID_CONFIG, f"expected an ExperimentConfiguration, got {type(config).__name__}")
        errors = config.validation_errors()
        if iterations < 1:
            errors.append(f"iterations={iterations} must be at least 1")
        if warmup < 0:
            errors.append(f"warmup={warmup} must not be negative")
        if errors:
            return fail(STATUS_INVALID_CONFIG, "invalid configuration: " + "; ".join(errors))

        resets_each_launch = self.uses_resets()  # the first run with reset='auto' proves idempotence
        if not self.healthy:
            status, error = self._why_unusable()
            return fail(status, error, executed=True)

        # Code.
        try:
            code = compiled if compiled is not None else self.compile(config)
        except ConfigurationError as exc:
            return fail(STATUS_INVALID_CONFIG, str(exc))
        except (CompileError, MnemeError) as exc:
            return fail(STATUS_COMPILE_ERROR, str(exc))
        try:
            loaded = self._load(code)
        except ArtifactError as exc:
            return fail(STATUS_COMPILE_ERROR, str(exc))
        except Exception as exc:
            if self._driver_failure(exc) in eng.CONTEXT_DESTROYING:
                return fail(STATUS_RUNTIME_ERROR, f"loading the kernel destroyed the CUDA context: {exc}")
            return fail(STATUS_COMPILE_ERROR, f"the driver could not load the compiled kernel: {exc}")
        attrs = loaded.attributes
        load_seconds, loaded.load_seconds = loaded.load_seconds, 0.0
        measured = {
            "obj_size": code.obj_size,
            "reg_usage": attrs.get("num_regs", -1),
            "local_mem_usage": attrs.get("local_size_bytes", -1),
            "const_mem_usage": attrs.get("const_size_bytes", -1),
            "shared_mem_usage": attrs.get("shared_size_bytes", -1),
            "codegen_time": code.codegen_time + load_seconds,
            "opt_time": code.opt_time,
            "preprocess_ir_time": code.preprocess_ir_time,
            "compile_cached": code.cached,
        }

        # Launch checks the driver would refuse less clearly.
        if config.threads_per_block > attrs.get("max_threads_per_block", 1024):
            return fail(
                STATUS_INVALID_LAUNCH,
                f"{config.threads_per_block} threads per block exceed what this kernel can launch with "
                f"({attrs['max_threads_per_block']}: registers or launch bounds limit it)",
                **measured,
            )
        try:
            self._set_dynamic_shared(loaded, config.shared_mem)
        except Exception as exc:
            if eng.cuda_error_code(exc) is None:
                raise
            return fail(STATUS_INVALID_LAUNCH, f"shared_mem={config.shared_mem} is not possible: {exc}", **measured)

        plan = self.launch_plan
        launch_errors = plan.launch_errors(config.grid.as_tuple())
        if launch_errors:
            return fail(STATUS_INVALID_LAUNCH, "; ".join(launch_errors), **measured)

        # State, launches, comparisons.
        state = self._state
        homes = loaded.global_homes
        checks, checked_regions = self._checks(homes)
        launches = warmup + iterations

        def replay(resets: list) -> dict | ExperimentResult:
            """The launches from a full reset, ``resets`` before each; the engine's output, or a failed result."""
            try:
                state.apply_map(state.relocation_map(homes))
                state.full_reset(homes)
                return loaded.function.run(
                    config.grid.as_tuple(),
                    config.block.as_tuple(),
                    config.shared_mem,
                    loaded.args,
                    launches,
                    resets=resets,
                    checks=checks,
                    check_launches=self._checked_launches(launches),
                    queue_ahead_ns=_queue_ahead_ns(launches) if self.queue_ahead else 0,
                    l2_scrub_bytes=self._l2_scrub_bytes(sum(size for _, _, size in resets)),
                    timeout_s=self.timeout_s,
                    cupti=self.timing == "cupti",
                    attributes=list(plan.attributes),
                    param_offsets=loaded.param_offsets,
                )
            except Exception as exc:
                code_no = self._driver_failure(exc)
                if code_no in eng.LAUNCH_REFUSED:
                    return fail(STATUS_INVALID_LAUNCH, f"the driver refused the launch: {exc}", **measured)
                if code_no in eng.CONTEXT_DESTROYING:
                    status = STATUS_TIMEOUT if code_no == eng.TIMEOUT_CODE else STATUS_RUNTIME_ERROR
                    return fail(
                        status,
                        f"the kernel failed ({exc}); the CUDA context is destroyed: this replayer must be dropped "
                        "and the process replaced",
                        executed=True,
                        **measured,
                    )
                return fail(STATUS_RUNTIME_ERROR, f"the replay failed: {exc}", executed=True, **measured)

        out = replay(state.iteration_resets(homes) if resets_each_launch else [])
        if isinstance(out, ExperimentResult):
            return out
        mismatches = self._judge(checked_regions, out, warmup, homes)
        if mismatches and not resets_each_launch and all(0 not in m["failed_launches"] for m in mismatches):
            # Idempotence was proven for the recorded launch, not for this configuration: its first launch
            # (from the recorded memory) verified and a later one, run on what the previous launch left,
            # did not. Judge it as the application runs it: the written memory reset before every launch.
            resets_each_launch = True
            out = replay(state.iteration_resets(homes))
            if isinstance(out, ExperimentResult):
                return out
            mismatches = self._judge(checked_regions, out, warmup, homes)
        self.last_timing = {
            "wall_ns": out["wall_ns"],
            "gpu_span_ns": out["gpu_span_ns"],
            "queue_ahead_ns": _queue_ahead_ns(launches) if self.queue_ahead else 0,
            "launches": launches,
            "times_ns": list(out["times_ns"]),
            "event_times_ns": list(out["event_times_ns"]),
            "checked_launches": list(out["checked_launches"]),
            "reset_each_launch": resets_each_launch,
        }

        verified = not mismatches
        error = "" if verified else _mismatch_summary(mismatches)
        nondeterminism: list[dict[str, Any]] = []
        if config.ground().hash() == self.baseline().ground().hash() and (mismatches or self._probe is not None):
            # The recorded launch itself: say what its own runs show (they are replayed once, on failure).
            probe = self.probe()
            if probe is not None:
                nondeterminism = [f.to_dict() for f in probe.findings if f.classification != "exact"]
                if mismatches and nondeterminism:
                    hint = "" if self.tolerance == "auto" else "; nondeterministic regions verify with --tolerance auto"
                    error += f"; the recorded launch replayed {probe.runs} times: {summarize(probe.findings)}{hint}"
            elif mismatches:
                error += f"; {self.probe_error}"
        result = ExperimentResult(
            exec_time=[int(t) for t in out["times_ns"]],
            verified=verified,
            executed=True,
            failed=False,
            end_time=_now(),
            status=STATUS_VERIFIED if verified else STATUS_FAILED_VERIFICATION,
            mismatches=mismatches,
            error=error,
            verified_within=self._within(checked_regions, out) if verified else {},
            nondeterminism=nondeterminism,
            **base,
            **measured,
        )
        return result

    def _prove_idempotent(self) -> bool:
        """Run the baseline twice with no reset between; idempotent when both launches match the epilogue.

        Anything that goes wrong here (the baseline does not verify, a
        launch is refused) only means "not proven": every launch is then reset.
        """
        baseline = self.baseline()
        if self.launch_plan.launch_errors(baseline.grid.as_tuple()):
            return False
        try:
            loaded = self._load(self.compile(baseline))
            self._set_dynamic_shared(loaded, baseline.shared_mem)
        except Exception as exc:
            if isinstance(exc, (CompileError, MnemeError)) or eng.cuda_error_code(exc) is not None:
                return False
            raise
        state, homes = self._state, loaded.global_homes
        checks, checked = self._checks(homes)
        try:
            state.apply_map(state.relocation_map(homes))
            state.full_reset(homes)
            out = loaded.function.run(
                baseline.grid.as_tuple(), baseline.block.as_tuple(), baseline.shared_mem, loaded.args, 2,
                resets=[], checks=checks, check_launches=[0, 1], timeout_s=self.timeout_s,
                attributes=list(self.launch_plan.attributes), param_offsets=loaded.param_offsets,
            )  # fmt: skip
        except Exception as exc:
            code_no = self._driver_failure(exc)
            if code_no in eng.CONTEXT_DESTROYING:
                self._proof_failure = (
                    STATUS_TIMEOUT if code_no == eng.TIMEOUT_CODE else STATUS_RUNTIME_ERROR,
                    f"the recorded baseline, launched to prove the kernel idempotent, failed ({exc}); the CUDA "
                    "context is destroyed: this replayer must be dropped and the process replaced",
                )
            return False
        return not self._judge(checked, out, 0, homes)

    def _checks(self, homes: dict[int, int]) -> tuple[list, list]:
        """The engine's comparisons of every region with its expected epilogue, and (region, policy) for each."""
        checks, checked_regions = [], []
        self._sources: dict[str, str] = {}
        derived = self.derived.policies if self.derived is not None else {}
        for r in self._state.regions:
            live = self._state.live_address(r, homes)
            if live is None:
                continue  # a global the recompiled module no longer has: the kernel cannot touch it
            policy, source = self.overrides.resolve(r.name, r.recorded_base, r.policy, derived.get(r.label))
            checks.append(engine_check(live, r.expected.ptr, r.size, policy))
            checked_regions.append((r, policy))
            self._sources[r.label] = source
        return checks, checked_regions

    def _within(self, checked_regions: list, out: dict) -> dict[str, Any]:
        """``verified_within``: per region judged with a tolerance, the bound used and the worst launch."""
        within: dict[str, Any] = {}
        for i, (region, policy) in enumerate(checked_regions):
            if policy.is_bitwise:
                continue
            worst = None
            for per_check in out["checks"]:
                stats, counters = per_check[i]
                worst = worse(worst, deviation(policy, stats, counters))
            worst = {k: v if not isinstance(v, float) or math.isfinite(v) else str(v) for k, v in (worst or {}).items()}
            entry = {"policy": policy.spec(), "source": self._sources.get(region.label, ""),
                     "exact": is_exact(worst), "worst": worst}
            if entry["source"] == "auto" and self.derived is not None:
                entry["derived"] = self.derived.provenance()
            within[region.label] = entry
        return within

    # -- nondeterminism ---------------------------------------------------------------------
    def probe(self) -> DerivedTolerance | None:
        """Replay the baseline ``tolerance_runs`` times and classify every region (cached; None when
        the baseline cannot run here, see ``probe_error``)."""
        if self._probe is None and self.healthy and not self.probe_error:
            from mneme.replay.probe import probe_baseline

            try:
                self._probe = probe_baseline(self, self.tolerance_runs, self.tolerance_safety)
                self.probe_error = ""
            except Exception as exc:
                if isinstance(exc, (CompileError, MnemeError)) or eng.cuda_error_code(exc) is not None:
                    if eng.cuda_error_code(exc) is not None:
                        self._driver_failure(exc)
                    self.probe_error = f"the baseline's runs failed: {exc}"
                    return None
                raise
        return self._probe

    def _derive_tolerance(self) -> None:
        """``tolerance='auto'``: the stored derivation of this instance, else one from the baseline's runs."""
        from mneme.replay.nondeterminism import load_derived, save_derived, sidecar_name

        store, name = self.recording.store, self.recording.database_name
        stored = load_derived(store, name, self.record_id)
        if stored is not None:
            self.derived, self.derived_stored = stored, f"read from {store.url}/{sidecar_name(name)}"
            return
        derived = self.probe()
        if derived is None:
            return  # the baseline cannot run: its own run says why
        self.derived = derived
        if not any(f.classification != "exact" for f in derived.findings):
            self.derived_stored = "not stored: every region was exact in every run"
        elif self.store_tolerance:
            try:
                self.derived_stored = f"written to {store.url}/{save_derived(store, name, self.record_id, derived)}"
            except (OSError, MnemeError) as exc:
                self.derived_stored = f"not stored ({exc})"

    def _judge(self, checked_regions: list, out: dict, warmup: int, homes: dict[int, int]) -> list[dict[str, Any]]:
        """One mismatch entry per region that failed in any checked launch (the first failing launch's numbers)."""
        failures: dict[int, dict[str, Any]] = {}
        failed_launches: dict[int, list[int]] = {}
        for launch, per_check in zip(out["checked_launches"], out["checks"]):
            for i, ((region, policy), (stats, counters)) in enumerate(zip(checked_regions, per_check)):
                verdict = judge(policy, stats, counters, region.size)
                if verdict.passed:
                    continue
                failed_launches.setdefault(i, []).append(launch)
                if i not in failures:
                    failures[i] = verdict.report
        mismatches = []
        for i, report in sorted(failures.items()):
            region, _ = checked_regions[i]
            entry = {
                "region": region.label,
                "kind": region.kind,
                "base": hex(region.recorded_base),
                "size": region.size,
                "failed_launches": failed_launches[i],
                "launches_checked": len(out["checked_launches"]),
                **report,
            }
            last = out["checked_launches"][-1]
            offset = report.get("first_mismatch_offset")
            if offset is not None and last in failed_launches[i]:
                live = self._state.live_address(region, homes)
                n = min(16, region.size - offset)
                entry["at_first_mismatch"] = {
                    "replayed": self.ctx.download(live + offset, n).hex(),
                    "recorded": self.ctx.download(region.expected.ptr + offset, n).hex(),
                }
            mismatches.append(entry)
        return mismatches

    def _driver_failure(self, exc: Exception) -> int:
        """The CUresult of a driver error (anything else propagates); one that destroys the context loses it."""
        code_no = eng.cuda_error_code(exc)
        if code_no is None:
            raise exc
        if code_no in eng.CONTEXT_DESTROYING:
            self._lose_context()
        return code_no

    def _lose_context(self) -> None:
        """The CUDA context is gone: this Replayer (and every other in the process) cannot run again."""
        self.healthy = False
        eng.load_engine().abandon_cleanup()  # freeing on a dead or busy context could block forever

    def _l2_scrub_bytes(self, reset_bytes: int) -> int:
        return 2 * self.ctx.l2_cache_size if self.l2_scrub and reset_bytes else 0

    def _checked_launches(self, launches: int) -> list[int]:
        if self.verify_every_iteration:
            return list(range(launches))
        return sorted({0, launches - 1})

    # -- modules --------------------------------------------------------------------------
    def _load(self, code: CompiledCode) -> _LoadedCode:
        key = code.key or f"recorded:{code.arch}:{len(code.image)}"
        if key in self._modules:
            self._modules.move_to_end(key)
            return self._modules[key]
        module = self.ctx.load_module(code.image)
        function = module.function(self.recording.kernel_name)
        homes: dict[int, int] = {}
        for r in self._state.regions:
            if r.kind != "global" or not r.name:
                continue
            try:
                address, size = module.global_(r.name)
            except Exception as exc:
                if eng.cuda_error_code(exc) is None:
                    raise
                if code.tier == "recorded":
                    raise ArtifactError(
                        f"the recorded module has no global {r.name!r} the recording restores; "
                        "the recording's code and snapshots do not belong together"
                    ) from None
                continue  # pruned from a recompiled module
            if size < r.size:
                raise ArtifactError(f"global {r.name} has {size} bytes in the module, the recording {r.size}")
            homes[r.recorded_base] = address
        rmap = self._state.relocation_map(homes)
        args = rmap.patch_args(self.instance.arguments, self._pointer_offsets())
        loaded = _LoadedCode(
            code, module, function, function.attributes(), homes, args, _param_offsets(function, len(args)),
            module.load_seconds,
        )
        self._modules[key] = loaded
        while len(self._modules) > MODULE_CACHE_ENTRIES:
            self._modules.popitem(last=False)
        return loaded

    def _pointer_offsets(self) -> list[int]:
        offsets = set(self.instance.pointer_args)
        offsets.update(p.offset for p in self.recording.kernel.params if p.kind == "pointer")
        return sorted(offsets)

    def _set_dynamic_shared(self, loaded: _LoadedCode, shared_mem: int) -> None:
        static = max(loaded.attributes.get("shared_size_bytes", 0), 0)
        if shared_mem + static > DEFAULT_DYNAMIC_SHARED_LIMIT or shared_mem > loaded.attributes.get(
            "max_dynamic_shared_size_bytes", DEFAULT_DYNAMIC_SHARED_LIMIT
        ):
            loaded.function.set_attribute("max_dynamic_shared_size_bytes", shared_mem)
            loaded.attributes["max_dynamic_shared_size_bytes"] = shared_mem


def _param_offsets(function: Any, arg_bytes: int) -> list[int]:
    """Where the loaded function's parameters start, when its layout fits the recorded bytes.

    Launching with one pointer per parameter (as cudart does) works for every
    launch kind, cooperative ones included, and for parameter buffers up to the
    driver's 32 764 bytes; without a layout the bytes go as one buffer.
    """
    try:
        layout = function.param_info()
    except Exception as exc:
        if eng.cuda_error_code(exc) is None:
            raise
        return []
    if not layout or any(offset + size > arg_bytes for offset, size in layout):
        return []
    return [offset for offset, _ in layout]


def _queue_ahead_ns(launches: int) -> int:
    """How long the GPU spins while the loop is enqueued: ~20 us of host work per launch, at most 10 ms."""
    return min(20_000 + 20_000 * launches, 10_000_000)


def _mismatch_summary(mismatches: list[dict[str, Any]]) -> str:
    parts = []
    for m in mismatches:
        if "same_multiset" in m:
            what = f"not the recorded multiset of {m['elements']} {m['policy']['dtype']} elements"
        elif "mismatched_bytes" in m:
            what = f"{m['mismatched_bytes']} of {m['size']} bytes differ (first at offset {m.get('first_mismatch_offset')})"
        elif "diff_norm" in m:
            what = f"{m['policy']['norm']} norm of the difference {m['diff_norm']:.3g} > {m['limit']:.3g}"
        else:
            ulp = f", {m['max_ulp']} ULP" if m.get("max_ulp") is not None else ""
            bound = f" > {m['policy']['threshold']:g} ULP" if m["policy"].get("mode") == "ulp" else ""
            what = (f"{m.get('mismatched_elements', '?')} of {m['elements']} elements outside tolerance "
                    f"(max abs diff {m['max_abs_diff']:.3g}{ulp}{bound})")
        parts.append(f"region {m['region']} ({m['kind']}): {what}; failed launches {m['failed_launches']}")
    return "verification failed: " + "; ".join(parts)
