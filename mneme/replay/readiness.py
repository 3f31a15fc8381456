"""What a replayed instance settles once, before its configurations: the reset policy's proof and ``auto``'s bounds.

One job: the one-time work whose answers every configuration's replay uses.

* The reset policy (``reset="auto"``): the recorded baseline launched once
  from the recorded memory, then once more on what it left, under a watchdog
  derived from its time (:func:`proof_watchdog`); when both launches match the
  epilogue the kernel is idempotent, and configurations skip the per-launch
  resets (``uses_resets``). Anything else means "reset before every launch"
  (``reset_reason`` says why): a kernel that consumes its own state (work
  queues, tickets, spin-waits on counters, locks) is replayed as the
  application runs it. A second launch that faults or does not finish
  destroys this process's CUDA context (``failure``): the caller replaces the
  process and replays with resets before every launch (:class:`ResetDecision`).
* The tolerance (``mode="auto"``): the bounds stored beside the recording
  (``<static>.tolerance.json``, ``nondeterminism.load_derived``), else the
  baseline replayed ``runs`` times (``probe.probe_baseline``) and the bounds
  derived from its spread, stored when anything was nondeterministic. The same
  runs say, for a failing baseline, which regions are nondeterministic
  (``probe``).

``Replayer.get_ready`` does both before the first configuration (a server's
Prepare), so that neither is counted in a configuration's time.
"""

from __future__ import annotations

from typing import Any

from mneme.errors import MnemeError
from mneme.model.experiment import STATUS_RUNTIME_ERROR, STATUS_TIMEOUT, ExperimentConfiguration
from mneme.model.verification import ResetDecision, VerificationSettings
from mneme.replay import engine as eng
from mneme.replay import judge
from mneme.replay.compile import CompileError
from mneme.replay.launch import Launcher
from mneme.replay.launch_attrs import LaunchPlan
from mneme.replay.nondeterminism import DerivedTolerance
from mneme.replay.tolerance import ToleranceOverrides

#: Reset policies: ``auto`` resets before every launch unless the instance is proven idempotent
#: (then only before each configuration's first launch); ``always`` resets before every launch.
RESET_POLICIES = ("auto", "always")
#: The proof's second launch may take this many times the kernel's time (recorded, or measured by
#: the first launch) before it counts as hung; never less than ``PROOF_WATCHDOG_MIN_S``.
PROOF_WATCHDOG_FACTOR = 20
PROOF_WATCHDOG_MIN_S = 0.05


def proof_watchdog(kernel_ns: float | None) -> float:
    """How long the proof's second launch may run: ``PROOF_WATCHDOG_FACTOR`` x the kernel's time, at least
    ``PROOF_WATCHDOG_MIN_S`` (a kernel that spins on state its first launch consumed never ends).

    Args:
        kernel_ns: the kernel's time in nanoseconds (recorded in the application, or measured); None: unknown.

    Returns:
        Seconds.
    """
    if not kernel_ns or kernel_ns <= 0:
        return PROOF_WATCHDOG_MIN_S * PROOF_WATCHDOG_FACTOR
    return max(PROOF_WATCHDOG_MIN_S, PROOF_WATCHDOG_FACTOR * kernel_ns / 1e9)


class Readiness:
    """The reset policy's proof and ``auto``'s bounds for one instance, each settled once.

    Attributes:
        idempotent: whether the baseline proved idempotent (None: not tried yet, or ``reset='always'``).
        derived: the bounds ``auto`` judges with (stored or derived here; None: none yet, or ``exact``).
        derived_stored: where they were read from or written to.
        probe_error: why the baseline's repeated runs could not run ('' when they could, or did not yet).
        failure: (status, error) when the proof destroyed the CUDA context.
    """

    def __init__(
        self,
        launcher: Launcher,
        baseline: ExperimentConfiguration,
        overrides: ToleranceOverrides,
        verification: VerificationSettings,
        reset: str,
        store_tolerance: bool,
        record_id: str,
        decided: ResetDecision | None = None,
        kernel_ns: int | None = None,
    ):
        """Settle what ``launcher``'s instance needs, on demand.

        Args:
            launcher: the instance's launcher (its context, state and code).
            baseline: the recorded launch as a configuration.
            overrides: the policies that win over the recorded annotations (the proof's checks judge with them).
            verification: the mode, and the baseline's runs and safety factor for ``auto``.
            reset: ``auto`` or ``always`` (:data:`RESET_POLICIES`).
            store_tolerance: write derived bounds beside the recording.
            record_id: the instance's dynamic hash (its entry in the stored bounds).
            decided: the reset policy as decided elsewhere (no proof is made here).
            kernel_ns: the kernel's time in the application, when recorded (the proof's watchdog).
        """
        self.launcher, self.baseline, self.overrides = launcher, baseline, overrides
        self.mode, self.runs, self.safety = verification.mode, verification.runs, verification.safety
        self.reset, self.store_tolerance, self.record_id = reset, store_tolerance, record_id
        self.idempotent: bool | None = None
        self.reset_reason = "the reset policy is always" if reset == "always" else ""
        self.kernel_ns = kernel_ns
        self._undecidable = False
        self.measured_ns: int | None = None  # the kernel's time as the proof's first launch measured it
        if decided is not None:
            self.idempotent = not decided.each_launch
            self.reset_reason = decided.reason if decided.each_launch else ""
        self.derived: DerivedTolerance | None = None
        self.derived_stored = ""
        self.probe_error = ""
        self.failure: tuple[str, str] | None = None
        self._probe: DerivedTolerance | None = None  # the baseline's own runs, here

    @property
    def probed(self) -> bool:
        """Whether the baseline's repeated runs were made (by ``auto``, or a failing baseline)."""
        return self._probe is not None

    def uses_resets(self, plan: LaunchPlan) -> bool:
        """Whether launches after a configuration's first reset the written memory; settles first
        what is not settled yet (``auto``'s bounds, before the proof: its checks judge with them).

        Args:
            plan: the recorded launch attributes.

        Returns:
            True with ``reset='always'`` or when the baseline did not prove idempotent.
        """
        if self.mode == "auto" and self.derived is None:
            self.derive_tolerance(plan)
        if self.reset == "always" and self.idempotent is None:
            return True
        if self.idempotent is None:
            self.idempotent = self.prove_idempotent(plan)
        return not self.idempotent

    def decision(self) -> ResetDecision | None:
        """What the proof decided, for a process that replays the instance next (None: not decided yet).

        Returns:
            The decision.
        """
        if self.reset == "always" and self.idempotent is None:
            return ResetDecision(True, self.reset_reason)
        if self.idempotent is None or self._undecidable:
            return None
        return ResetDecision(not self.idempotent, self.reset_reason)

    def unusable(self) -> tuple[str, str]:
        """(status, error) of an instance whose context is lost: the proof's failure, or a plain loss.

        Returns:
            The status and the error.
        """
        return self.failure or (STATUS_RUNTIME_ERROR, "the CUDA context was lost")

    def prove_idempotent(self, plan: LaunchPlan) -> bool:
        """Launch the baseline from the recorded memory, then once more on what it left; idempotent
        when both launches match the epilogue.

        The second launch runs under :func:`proof_watchdog` of the kernel's time. Anything that goes
        wrong (the baseline does not verify, a launch is refused, the second launch differs, faults
        or does not finish) means "reset before every launch", with the reason in ``reset_reason``.
        A second launch that faults or does not finish also destroys the CUDA context: ``failure``
        says so, and the process must be replaced (the next one replays with resets before every
        launch: :meth:`decision`).

        Args:
            plan: the recorded launch attributes.

        Returns:
            Whether the baseline proved idempotent.
        """
        launcher, baseline = self.launcher, self.baseline
        if plan.launch_errors(baseline.grid.as_tuple()):
            self.reset_reason = "the recorded launch cannot be repeated here, so idempotence is not proven"
            return False
        try:
            loaded = launcher.load(launcher.compile(baseline))
            launcher.set_dynamic_shared(loaded, baseline.shared_mem)
        except Exception as exc:
            if isinstance(exc, (CompileError, MnemeError)) or eng.cuda_error_code(exc) is not None:
                self.reset_reason = f"idempotence is not proven: the recorded code did not load ({exc})"
                return False
            raise
        homes = loaded.global_homes
        checks = judge.plan_checks(launcher.state, homes, self.overrides, self.derived)
        step = "its first launch"
        try:
            first = launcher.launch(loaded, baseline, 1, plan, resets=[], checks=checks.checks, check_launches=[0],
                                    timed=False)  # fmt: skip
            if judge.mismatches(checks, first, launcher.state, homes):
                self.reset_reason = "idempotence is not proven: the recorded launch does not reproduce the recording"
                return False
            measured = (first.get("times_ns") or [0])[0]
            self.measured_ns = int(measured) or None
            watchdog = proof_watchdog(max(measured or 0, self.kernel_ns or 0) or None)
            step = f"a second launch without a reset (watchdog {watchdog:.3g} s)"
            second = launcher.launch(loaded, baseline, 1, plan, resets=[], checks=checks.checks, check_launches=[0],
                                     timed=False, from_recorded=False, timeout_s=watchdog)  # fmt: skip
        except Exception as exc:
            code_no = launcher.driver_failure(exc)
            second = step != "its first launch"
            if code_no in eng.CONTEXT_DESTROYING:
                what = f"did not finish ({exc})" if code_no == eng.TIMEOUT_CODE else f"failed ({exc})"
                self.failure = (
                    STATUS_TIMEOUT if code_no == eng.TIMEOUT_CODE else STATUS_RUNTIME_ERROR,
                    f"the recorded baseline, launched to prove the kernel idempotent, {what} in {step}; the CUDA "
                    "context is destroyed: " + ("replay in a fresh process with resets before every launch" if second
                                                else "this replayer must be dropped and the process replaced"),
                )
                if second:  # the kernel consumes its own state: every launch needs its reset
                    self.reset_reason = (f"the kernel is not idempotent: {step} {what}; the written memory is "
                                         "reset before every launch")
                else:
                    self._undecidable = True  # the recorded launch itself fails: resets would not help
            else:
                self.reset_reason = f"idempotence is not proven: {step} failed ({exc})"
            return False
        found = judge.mismatches(checks, second, launcher.state, homes)
        if found:
            regions = sorted({str(m.get("region", "?")) for m in found})
            self.reset_reason = ("the kernel is not idempotent: a second launch without a reset changed "
                                 f"{', '.join(regions[:4])}{' ...' if len(regions) > 4 else ''}")
            return False
        return True

    def probe(self, plan: LaunchPlan) -> DerivedTolerance | None:
        """The baseline replayed ``runs`` times and every region classified (once).

        Args:
            plan: the recorded launch attributes.

        Returns:
            The findings and the bounds they give; None when the baseline cannot run here
            (``probe_error`` says why).
        """
        if self._probe is None and self.launcher.healthy and not self.probe_error:
            from mneme.replay.probe import probe_baseline

            launcher = self.launcher
            try:
                self._probe = probe_baseline(launcher, self.baseline, plan, self.runs, self.safety)
                self.probe_error = ""
            except Exception as exc:
                if isinstance(exc, (CompileError, MnemeError)) or eng.cuda_error_code(exc) is not None:
                    if eng.cuda_error_code(exc) is not None:
                        launcher.driver_failure(exc)
                    self.probe_error = f"the baseline's runs failed: {exc}"
                    return None
                raise
        return self._probe

    def derive_tolerance(self, plan: LaunchPlan) -> None:
        """``auto``'s bounds: the stored derivation of this instance, else one from the baseline's runs
        (stored when it found anything nondeterministic and ``store_tolerance`` is set).

        Args:
            plan: the recorded launch attributes.
        """
        from mneme.replay.nondeterminism import load_derived, save_derived, sidecar_name

        recording = self.launcher.recording
        store, name = recording.store, recording.database_name
        stored = load_derived(store, name, self.record_id)
        if stored is not None:
            self.derived, self.derived_stored = stored, f"read from {store.url}/{sidecar_name(name)}"
            return
        derived = self.probe(plan)
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

    def baseline_findings(self, config: ExperimentConfiguration, found: list[dict[str, Any]],
                          plan: LaunchPlan) -> tuple[list[dict[str, Any]], str]:  # fmt: skip
        """For a replay of the recorded launch that failed (or after the baseline's runs were made):
        what those runs say (:func:`mneme.replay.judge.baseline_findings`); they are made here if need be.

        Args:
            config: the replayed configuration.
            found: its mismatches.
            plan: the recorded launch attributes.

        Returns:
            (``result.nondeterminism``, what the error adds); empty for any other configuration.
        """
        if (found or self._probe is not None) and config.ground() == self.baseline.ground():
            return judge.baseline_findings(self.probe(plan), self.probe_error, found, self.mode)
        return [], ""
