"""The report's plots: Optuna's visualizations of a run's study, with what a tuning report needs on top
(the baseline's line, failures drawn as failures, log axes where the values span decades).

Each plot is made twice where the libraries are there: interactive HTML through plotly (the pages load
``plotly.min.js`` from beside them: they work offline) and PNG through matplotlib. :data:`PLOTS` lists
them; :func:`applicable` says which apply to a study and why the others do not.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

#: The plots, in the order the index shows them.
PLOTS = ("optimization_history", "param_importances", "slice", "parallel_coordinate", "contour",
         "pareto_front", "timeline")
#: The most parameters a contour plot pairs (the most important ones): it draws every pair.
CONTOUR_PARAMS = 3
#: Values whose largest is this many times their smallest get a log axis.
DECADE = 10.0
FAILURE_COLOR = "crimson"


@dataclass
class Plotting:
    """What the plots of one report are drawn from.

    ``study``: every trial of the run, numbered as in ``trials.jsonl`` (verified ones COMPLETE with the
    metric, the others FAIL with their status); ``varying``: its parameters that take more than one value
    among the completed trials; ``failures``: (trial number, status, error) of the failed ones; ``pareto``:
    the multi-objective study of an NSGA-II run (None otherwise); ``metric_names``: its objectives' names.
    """

    study: Any
    target_name: str
    varying: list[str]
    baseline_metric: float | None = None
    failures: list[tuple[int, str, str]] = field(default_factory=list)
    pareto: Any = None
    metric_names: list[str] = field(default_factory=list)

    @property
    def completed(self) -> list[Any]:
        return [t for t in self.study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]

    @property
    def log_values(self) -> bool:
        """The metric spans a decade or more (the baseline included): a log axis."""
        values = [t.value for t in self.completed] + ([self.baseline_metric] if self.baseline_metric else [])
        return bool(values) and min(values) > 0 and max(values) / min(values) >= DECADE


def applicable(plotting: Plotting, plot: str) -> str:
    """Whether ``plot`` is drawn for ``plotting``.

    Args:
        plotting: the study and what goes with it.
        plot: one of :data:`PLOTS`.

    Returns:
        "" when it applies, else why it is not drawn.
    """
    varying = plotting.varying
    if plot == "optimization_history":
        return "" if plotting.completed else "no verified trial"
    if plot in ("param_importances", "slice"):
        return "" if varying else "no parameter varies among the verified trials"
    if plot == "parallel_coordinate":
        return "" if len(varying) >= 2 else "fewer than 2 parameters vary among the verified trials"
    if plot == "contour":
        if len(varying) < 2:
            return "fewer than 2 parameters vary among the verified trials"
        return "" if len(plotting.completed) >= 3 else "fewer than 3 verified trials"
    if plot == "pareto_front":
        return "" if plotting.pareto is not None else "a single-objective run (Pareto fronts are for --sampler nsga2)"
    if plot == "timeline":
        return ""
    return f"unknown plot {plot}"


@contextlib.contextmanager
def _quiet_experimental() -> Iterator[None]:
    """Optuna marks some of its visualizations experimental: no warning for each plot."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def _contour_params(plotting: Plotting) -> list[str]:
    if len(plotting.varying) <= CONTOUR_PARAMS:
        return plotting.varying
    from optuna.importance import get_param_importances

    ranked = get_param_importances(plotting.study, params=plotting.varying)
    return list(ranked)[:CONTOUR_PARAMS]


def _optuna_plot(module: Any, plotting: Plotting, plot: str) -> Any:
    """Optuna's visualization ``plot`` from ``module`` (``optuna.visualization`` or its ``matplotlib``)."""
    study, name = plotting.study, plotting.target_name
    with _quiet_experimental():
        if plot == "pareto_front":
            return module.plot_pareto_front(plotting.pareto, target_names=plotting.metric_names)
        if plot == "timeline":
            return module.plot_timeline(study)
        if plot == "optimization_history":
            return module.plot_optimization_history(study, target_name=name)
        params = _contour_params(plotting) if plot == "contour" else plotting.varying
        return getattr(module, f"plot_{plot}")(study, params=params, target_name=name)


def _failure_height(plotting: Plotting) -> float:
    """Where the history plot marks failures: above the highest verified value."""
    completed = [t.value for t in plotting.completed]
    return max(completed + [plotting.baseline_metric or 0]) * (1.25 if plotting.log_values else 1.05)


# -- HTML (plotly) -----------------------------------------------------------------------------------
def plotly_figure(plotting: Plotting, plot: str) -> Any:
    """The plotly figure of ``plot``.

    Args:
        plotting: the study and what goes with it.
        plot: one of :data:`PLOTS` that applies.

    Returns:
        The figure, with the baseline's line, failures and log axes where they belong.
    """
    import optuna.visualization as v
    import plotly.graph_objects as go

    fig = _optuna_plot(v, plotting, plot)
    if plot not in ("optimization_history", "slice"):
        return fig
    if plot == "optimization_history" and plotting.failures:
        fig.add_trace(go.Scatter(
            x=[n for n, _, _ in plotting.failures], y=[_failure_height(plotting)] * len(plotting.failures),
            mode="markers", name=f"failed ({len(plotting.failures)})",
            marker={"symbol": "x", "color": FAILURE_COLOR, "size": 9},
            hovertext=[f"trial {n}: {status}: {error[:200]}" for n, status, error in plotting.failures],
            hoverinfo="text"))
    if plotting.log_values:
        fig.update_yaxes(type="log")
    if plotting.baseline_metric is not None:
        line = {"y": plotting.baseline_metric, "line_dash": "dash", "line_color": "gray"}
        try:
            fig.add_hline(**line, annotation_text="baseline", row="all", col="all")
        except Exception:  # noqa: BLE001 - a figure without subplots
            fig.add_hline(**line, annotation_text="baseline")
    return fig


def write_html(plotting: Plotting, plot: str, out: Path) -> Path:
    """Write ``out/PLOT.html``.

    Args:
        plotting: the study and what goes with it.
        plot: one of :data:`PLOTS` that applies.
        out: the report directory.

    Returns:
        The page's path; it loads ``plotly.min.js`` from ``out`` (written there once): no network needed.
    """
    fig = plotly_figure(plotting, plot)
    path = out / f"{plot}.html"
    fig.write_html(str(path), include_plotlyjs="directory", full_html=True)
    return path


# -- PNG (matplotlib) --------------------------------------------------------------------------------
def write_png(plotting: Plotting, plot: str, out: Path) -> Path:
    """Write ``out/PLOT.png`` through Optuna's matplotlib visualizations.

    Args:
        plotting: the study and what goes with it.
        plot: one of :data:`PLOTS` that applies.
        out: the report directory.

    Returns:
        The image's path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as vm

    ax = _optuna_plot(vm, plotting, plot)
    axes = list(ax.flat) if hasattr(ax, "flat") else [ax]
    if plot in ("optimization_history", "slice"):
        for a in axes:
            if plotting.log_values:
                a.set_yscale("log")
            if plotting.baseline_metric is not None:
                a.axhline(plotting.baseline_metric, linestyle="--", color="gray", label="baseline")
        if plot == "optimization_history" and plotting.failures:
            axes[0].scatter([n for n, _, _ in plotting.failures], [_failure_height(plotting)] * len(plotting.failures),
                            marker="x", color=FAILURE_COLOR, label=f"failed ({len(plotting.failures)})")
        axes[0].legend(loc="best")
    fig = axes[0].get_figure()
    if plot in ("slice", "contour"):
        fig.set_size_inches(max(8, 4 * min(len(axes), 4)), 5 if plot == "slice" else 4 * min(len(axes), 4) ** 0.5)
    for a in axes:
        for label in a.get_xticklabels():
            label.set_rotation(60)
            label.set_horizontalalignment("right")
    path = out / f"{plot}.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
