"""What a replayed instance settles once, before its configurations: the reset policy's proof and ``auto``'s bounds.

One job: the one-time work whose answers every configuration's replay uses.

* The reset policy (``reset="auto"``): the recorded baseline launched twice
  with no reset between; when both launches match the epilogue the kernel is
  idempotent, and configurations skip the per-launch resets (``uses_resets``).
  Anything that goes wrong only means "not proven", except a fault that
  destroys the CUDA context: then the instance cannot run (``failure``).
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
from mneme.model.verification import VerificationSettings
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
        """
        self.launcher, self.baseline, self.overrides = launcher, baseline, overrides
        self.mode, self.runs, self.safety = verification.mode, verification.runs, verification.safety
        self.reset, self.store_tolerance, self.record_id = reset, store_tolerance, record_id
        self.idempotent: bool | None = None
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
        if self.reset == "always":
            return True
        if self.idempotent is None:
            self.idempotent = self.prove_idempotent(plan)
        return not self.idempotent

    def unusable(self) -> tuple[str, str]:
        """(status, error) of an instance whose context is lost: the proof's failure, or a plain loss.

        Returns:
            The status and the error.
        """
        return self.failure or (STATUS_RUNTIME_ERROR, "the CUDA context was lost")

    def prove_idempotent(self, plan: LaunchPlan) -> bool:
        """Run the baseline twice with no reset between; idempotent when both launches match the epilogue.

        Anything that goes wrong here (the baseline does not verify, a
        launch is refused) only means "not proven": every launch is then reset.
        A fault that destroys the context sets ``failure``.

        Args:
            plan: the recorded launch attributes.

        Returns:
            Whether the baseline proved idempotent.
        """
        launcher, baseline = self.launcher, self.baseline
        if plan.launch_errors(baseline.grid.as_tuple()):
            return False
        try:
            loaded = launcher.load(launcher.compile(baseline))
            launcher.set_dynamic_shared(loaded, baseline.shared_mem)
        except Exception as exc:
            if isinstance(exc, (CompileError, MnemeError)) or eng.cuda_error_code(exc) is not None:
                return False
            raise
        homes = loaded.global_homes
        checks = judge.plan_checks(launcher.state, homes, self.overrides, self.derived)
        try:
            out = launcher.launch(loaded, baseline, 2, plan, resets=[], checks=checks.checks, check_launches=[0, 1],
                                  timed=False)  # fmt: skip
        except Exception as exc:
            code_no = launcher.driver_failure(exc)
            if code_no in eng.CONTEXT_DESTROYING:
                self.failure = (
                    STATUS_TIMEOUT if code_no == eng.TIMEOUT_CODE else STATUS_RUNTIME_ERROR,
                    f"the recorded baseline, launched to prove the kernel idempotent, failed ({exc}); the CUDA "
                    "context is destroyed: this replayer must be dropped and the process replaced",
                )
            return False
        return not judge.mismatches(checks, out, launcher.state, homes)

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
        if config.ground().hash() == self.baseline.ground().hash() and (found or self._probe is not None):
            return judge.baseline_findings(self.probe(plan), self.probe_error, found, self.mode)
        return [], ""
