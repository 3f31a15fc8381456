"""``mneme tune report DIR``: plots of a finished (or interrupted) run.

Rebuilds an in-memory Optuna study from ``trials.jsonl`` (verified trials,
objective = the run's metric) and draws, with Optuna's own visualizations,
the optimization history, the parameter importances and the metric against
each parameter: PNG through matplotlib, interactive HTML through plotly.
Either library may be missing; the report says which package to install.
"""

from __future__ import annotations

import html
import importlib.util
import json
import re
import warnings
from pathlib import Path
from typing import Any, Callable

from mneme.errors import ConfigurationError, NotAvailableError
from tuner.errors import cannot_write
from tuner.results.directory import ResultsDirectory, iter_verified
from tuner.results.summary import verification_counts

PLOTS = ("optimization_history", "param_importances", "slice")


def _natural_key(value: Any) -> tuple:
    """Sort "64x1x1" before "128x1x1": numbers inside strings compare as numbers."""
    parts = re.split(r"(\d+)", str(value))
    return (str(type(value)), tuple(int(p) if p.isdigit() else p for p in parts))


def _distribution(values: list[Any]):
    import optuna.distributions as d

    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return d.IntDistribution(min(values), max(values))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return d.FloatDistribution(float(min(values)), float(max(values)))
    return d.CategoricalDistribution(sorted(set(values), key=_natural_key))


def _plotted_params(record: dict[str, Any]) -> dict[str, Any]:
    """The trial's parameters, plus its threads per block (a numeric axis for launch shapes)."""
    params = dict(record.get("params") or {})
    block = (record.get("configuration") or {}).get("block")
    if block and "threads_per_block" not in params:
        params["threads_per_block"] = int(block["x"]) * int(block["y"]) * int(block["z"])
    return params


def study_from_trials(records: list[dict[str, Any]]):
    """An in-memory study holding the verified trials, in the order they finished."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    verified = list(iter_verified(records))
    plotted = [_plotted_params(r) for r in verified]
    names = sorted({k for p in plotted for k in p})
    distributions = {}
    for name in names:
        values = [p[name] for p in plotted if name in p]
        distributions[name] = _distribution(values)
    study = optuna.create_study(direction="minimize", study_name="mneme-tune-report")
    for r, all_params in zip(verified, plotted):
        params = {k: v for k, v in all_params.items() if k in distributions}
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions={k: distributions[k] for k in params}, value=float(r["metric"])))
    return study


def _varying_params(study) -> list[str]:
    names = set()
    for name in study.trials[0].params if study.trials else []:
        if len({str(t.params.get(name)) for t in study.trials}) > 1:
            names.add(name)
    return sorted(names)


def write_report(run_dir: str | Path) -> dict[str, Any]:
    """Write the plots under ``DIR/report/``; returns what was written and what was skipped, and why."""
    results = ResultsDirectory(run_dir)
    if not (results.path / "trials.jsonl").exists():
        raise ConfigurationError(f"{results.path} holds no trials.jsonl; give the --results-dir of a tuning run")
    records = results.load_trials()
    study = study_from_trials(records)
    if len(study.trials) < 2:
        raise ConfigurationError(
            f"{results.path} has {len(study.trials)} verified trial(s); the plots need at least 2"
        )
    have_mpl = importlib.util.find_spec("matplotlib") is not None
    have_plotly = importlib.util.find_spec("plotly") is not None
    if not (have_mpl or have_plotly):
        raise NotAvailableError(
            "the report needs matplotlib (PNG) or plotly (HTML): pip install 'mneme[plots]' "
            "(matplotlib) and/or pip install plotly"
        )
    out = results.path / "report"
    try:
        out.mkdir(exist_ok=True)
    except OSError as exc:
        raise cannot_write(out, exc) from exc
    varying = _varying_params(study)
    written: list[str] = []
    skipped: list[str] = []
    if not have_mpl:
        skipped.append("PNG plots: install matplotlib (pip install 'mneme[plots]')")
    if not have_plotly:
        skipped.append("HTML plots: install plotly (pip install plotly)")
    for plot in PLOTS:
        if plot == "param_importances" and not varying:
            skipped.append(f"{plot}: no parameter varies among the verified trials")
            continue
        kwargs = {"params": varying} if plot == "slice" and varying else {}
        if plot == "slice" and not varying:
            skipped.append(f"{plot}: no parameter varies among the verified trials")
            continue
        if have_mpl:
            written += _try(skipped, plot, "png", lambda p=plot: _write_png(study, p, out, kwargs))
        if have_plotly:
            written += _try(skipped, plot, "html", lambda p=plot: _write_html(study, p, out, kwargs))
    index = out / "index.html"
    index.write_text(_index_html(records, written, skipped))
    written.append(str(index))
    summary = {"written": written, "skipped": skipped, "verified_trials": len(study.trials),
               **verification_counts(records), "tolerance": (results.read_json("baseline.json") or {}).get("tolerance")}
    (out / "report.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _try(skipped: list[str], plot: str, kind: str, write: Callable[[], str]) -> list[str]:
    try:
        return [write()]
    except Exception as exc:  # noqa: BLE001 - one plot failing must not lose the others
        skipped.append(f"{plot}.{kind}: {type(exc).__name__}: {exc}")
        return []


def _write_png(study, plot: str, out: Path, kwargs: dict[str, Any]) -> str:
    import matplotlib
    import optuna

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as vm

    with warnings.catch_warnings():  # optuna marks its matplotlib plots experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        ax = getattr(vm, f"plot_{plot}")(study, target_name="time (ns)", **kwargs)
    axes = list(ax.flat) if hasattr(ax, "flat") else [ax]
    fig = axes[0].get_figure()
    fig.set_size_inches(max(8, 5 * len(axes)), 5)
    for a in axes:
        for label in a.get_xticklabels():
            label.set_rotation(60)
            label.set_horizontalalignment("right")
    path = out / f"{plot}.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return str(path)


def _write_html(study, plot: str, out: Path, kwargs: dict[str, Any]) -> str:
    import optuna.visualization as v

    fig = getattr(v, f"plot_{plot}")(study, target_name="time (ns)", **kwargs)
    path = out / f"{plot}.html"
    fig.write_html(str(path), include_plotlyjs="cdn")
    return str(path)


def _index_html(records: list[dict[str, Any]], written: list[str], skipped: list[str]) -> str:
    top = sorted(iter_verified(records), key=lambda r: r["metric"])[:10]
    counts = verification_counts(records)
    rows = "".join(
        f"<tr><td>{r['trial']}</td><td>{r['metric']:.0f}</td><td>{(r.get('speedup') or 0):.3f}</td>"
        f"<td><code>{html.escape(json.dumps(r['params']))}</code></td></tr>"
        for r in top
    )
    links = "".join(
        f"<li><a href='{html.escape(Path(w).name)}'>{html.escape(Path(w).name)}</a></li>" for w in written
    )
    images = "".join(f"<img src='{html.escape(Path(w).name)}' style='max-width:100%'>"
                     for w in written if w.endswith(".png"))
    notes = "".join(f"<li>{html.escape(s)}</li>" for s in skipped)
    return (
        "<!doctype html><meta charset='utf-8'><title>mneme tune report</title>"
        f"<h1>mneme tune report</h1><p>{len(records)} trials, {len(list(iter_verified(records)))} verified "
        f"({counts['verified_exact']} exactly, {counts['verified_within_tolerance']} within tolerance).</p>"
        "<h2>Best configurations</h2><table border=1><tr><th>trial</th><th>time (ns)</th><th>speedup</th>"
        f"<th>params</th></tr>{rows}</table><h2>Plots</h2><ul>{links}</ul>{images}"
        + (f"<h2>Not drawn</h2><ul>{notes}</ul>" if notes else "")
    )
