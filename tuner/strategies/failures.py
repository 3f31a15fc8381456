"""Failed configurations in an Optuna study: ``FAIL`` trials that TPE still learns from.

A configuration that fails (it does not compile, launch or verify) is told to the study as
``TrialState.FAIL``, with its status as the user attribute ``status``: what Optuna's tools (the dashboard,
``trials_dataframe``, the visualizations) take a failure to be. Optuna's TPE leaves ``FAIL`` trials out
of its model, though, and a tuner's failures are information: a region of block shapes that cannot launch
or pipelines that do not compile is a region to stay away from: on ``bench/tpe_efficiency.py``'s table,
TPE that ignored them needed more of the space to get within 5% of the optimum, and far more on its worst
seeds, than when failures counted as the worst values (bench/results/tpe_efficiency.md).

:class:`FailuresAsWorst` keeps both: it wraps the sampler and shows it each failed configuration's trial
as TPE's own mechanism for the worst trials shows them, a ``PRUNED`` trial without intermediate values
(TPE ranks those below every complete trial). Only trials marked as failed configurations are shown so:
an evaluated trial with a ``status`` user attribute, or one marked ``mneme:failed`` (a duplicate of a
failed configuration, a point the space's constraints exclude, a block shape banned after a failed
launch). A trial that failed for another reason (its process stopped, the executor failed before the
replay) stays a ``FAIL`` that the sampler ignores, as Optuna does.
"""

from __future__ import annotations

import copy
from typing import Any

#: System attribute of a FAIL trial that was not evaluated itself but whose configuration failed.
FAILED_ATTR = "mneme:failed"


def is_failed_configuration(trial: Any) -> bool:
    """Whether ``trial`` is the trial of a configuration that failed.

    Args:
        trial: an Optuna ``FrozenTrial``.

    Returns:
        True for a ``FAIL`` trial with a ``status`` user attribute or ``mneme:failed`` (not one abandoned
        or never evaluated).
    """
    return trial.state.name == "FAIL" and ("status" in trial.user_attrs or FAILED_ATTR in trial.system_attrs)


class _StudyView:
    """The study as the wrapped sampler sees it: failed configurations' trials as ``PRUNED``."""

    def __init__(self, study: Any, shown: dict[int, Any]) -> None:
        self._study = study
        self._shown = shown  # trial number -> its PRUNED copy (a finished trial does not change)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = True, states: Any = None, use_cache: bool = False) -> list[Any]:
        from optuna.trial import TrialState

        trials = self._study._get_trials(deepcopy=False, states=None, use_cache=use_cache)
        out = []
        for trial in trials:
            if trial.state == TrialState.FAIL and is_failed_configuration(trial):
                shown = self._shown.get(trial.number)
                if shown is None:
                    shown = self._shown[trial.number] = copy.copy(trial)
                    shown.state = TrialState.PRUNED
                    shown.intermediate_values = {}
                trial = shown
            if states is None or trial.state in states:
                out.append(trial)
        return copy.deepcopy(out) if deepcopy else out

    def get_trials(self, deepcopy: bool = True, states: Any = None) -> list[Any]:
        return self._get_trials(deepcopy=deepcopy, states=states)

    @property
    def trials(self) -> list[Any]:
        return self._get_trials()


def failures_as_worst(sampler: Any) -> Any:
    """Show ``sampler`` failed configurations as the worst trials (see the module).

    Args:
        sampler: an Optuna sampler (``TPESampler``).

    Returns:
        A sampler that delegates every call to ``sampler`` with a view of the study in which failed
        configurations' trials are ``PRUNED``.
    """
    import optuna

    class FailuresAsWorst(optuna.samplers.BaseSampler):
        """The wrapped sampler, told failed configurations' ``FAIL`` trials as ``PRUNED`` ones."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self._shown: dict[int, Any] = {}

        def _view(self, study: Any) -> _StudyView:
            return _StudyView(study, self._shown)

        def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
            return self.inner.infer_relative_search_space(self._view(study), trial)

        def sample_relative(self, study: Any, trial: Any, search_space: dict[str, Any]) -> dict[str, Any]:
            return self.inner.sample_relative(self._view(study), trial, search_space)

        def sample_independent(self, study: Any, trial: Any, param_name: str, param_distribution: Any) -> Any:
            return self.inner.sample_independent(self._view(study), trial, param_name, param_distribution)

        def before_trial(self, study: Any, trial: Any) -> None:
            self.inner.before_trial(study, trial)

        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            self.inner.after_trial(study, trial, state, values)

        def reseed_rng(self) -> None:
            self.inner.reseed_rng()

    return FailuresAsWorst(sampler)
