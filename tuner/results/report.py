"""``mneme tune report DIR``: what a finished (or interrupted) run found, as pages that tell the truth.

The report rebuilds the run as an in-memory Optuna study holding every trial of ``trials.jsonl`` under
its own number: verified trials are COMPLETE with the run's metric, the others FAIL with their status
and error (user attributes). Its parameters are the search space's as the sampler saw them, less those
fixed in the space; a block shape (``"XxYxZ"``) becomes one integer parameter per tuned axis
(``block_x``...), so that importances and slices treat it as the ordered quantity it is and nothing is
counted twice. From it :mod:`tuner.results.plots` draws Optuna's visualizations (history, importances,
slices, parallel coordinates, contours, the Pareto front of an NSGA-II run, the timeline) with the
baseline's line, failures marked and log axes where the values span decades: PNG through matplotlib,
HTML through plotly, which loads ``plotly.min.js`` written once beside the pages (no network needed).
``index.html`` lists the best configurations against the baseline and the failures by status.
"""

from __future__ import annotations

import html
import importlib.util
import json
import re
import warnings
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TextIO

from mneme.errors import ConfigurationError, NotAvailableError
from tuner.errors import cannot_write
from tuner.objective import Objective
from tuner.progress import describe_params, format_ns
from tuner.results.directory import TRIALS, ResultsDirectory, iter_verified
from tuner.results.fingerprint import distribution_of
from tuner.results.plots import DECADE, PLOTS, Plotting, applicable, write_html, write_png
from tuner.results.summary import verification_counts
from tuner.results.table import top_configurations

REPORT_DIR = "report"
BLOCK_AXES = ("block_x", "block_y", "block_z")


def _natural_key(value: Any) -> tuple:
    """Sort "64x1x1" before "128x1x1": numbers inside strings compare as numbers."""
    parts = re.split(r"(\d+)", str(value))
    return (str(type(value)), tuple(int(p) if p.isdigit() else p for p in parts))


def _inferred_distribution(values: list[Any]):
    """A distribution for a parameter the search space does not describe: from the values the trials took."""
    import optuna.distributions as d

    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        low, high = min(values), max(values)
        return d.IntDistribution(low, high, log=low >= 1 and high / low >= DECADE)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return d.FloatDistribution(float(min(values)), float(max(values)))
    return d.CategoricalDistribution(sorted(set(values), key=_natural_key))


def _block_axes(shapes: Sequence[str]) -> dict[str, list[int]]:
    """The values each block axis takes among ``"XxYxZ"`` shapes, for the axes that take more than one."""
    axes: dict[str, set[int]] = {name: set() for name in BLOCK_AXES}
    for shape in shapes:
        for name, extent in zip(BLOCK_AXES, str(shape).split("x")):
            axes[name].add(int(extent))
    return {name: sorted(values) for name, values in axes.items() if len(values) > 1}


class ReportSpace:
    """The parameters the report plots, from ``search_space.json`` (or, for a directory without it, from
    the trials): fixed dimensions left out, the block shape as integer axes."""

    def __init__(self, described: Mapping[str, Any] | None, records: Sequence[Mapping[str, Any]]) -> None:
        dims = dict(described or {})
        if not dims:  # no search_space.json: every parameter the trials have, as they took it
            names: dict[str, None] = {}
            for r in records:
                names.update(dict.fromkeys(r.get("params") or {}))
            dims = {name: None for name in names}
        self.fixed = [name for name, d in dims.items() if d is not None and (d.get("size") == 1 or d.get("type") == "fixed")]
        self.names = [name for name in dims if name not in self.fixed]
        self._described = {name: d for name, d in dims.items() if d is not None}
        shapes = (self._described.get("block_shape") or {}).get("choices") \
            or [(r.get("params") or {}).get("block_shape") for r in records if (r.get("params") or {}).get("block_shape")]
        self.block_axes = _block_axes(shapes) if "block_shape" in self.names else {}
        self.distributions = self._distributions(records)

    def params(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """A trial's plotted parameters."""
        given = record.get("params") or {}
        out: dict[str, Any] = {}
        for name in self.names:
            if name not in given:
                continue
            if name == "block_shape":
                extents = dict(zip(BLOCK_AXES, (int(e) for e in str(given[name]).split("x"))))
                out.update({axis: extents[axis] for axis in self.block_axes if axis in extents})
            else:
                out[name] = given[name]
        return out

    def _distributions(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        import optuna.distributions as d

        values: dict[str, list[Any]] = {}
        for r in records:
            for name, value in self.params(r).items():
                values.setdefault(name, []).append(value)
        out = {}
        for name, taken in values.items():
            if name in self.block_axes:
                low, high = min(self.block_axes[name]), max(self.block_axes[name])
                out[name] = d.IntDistribution(low, high, log=low >= 1 and high / low >= DECADE)
                continue
            described = self._described.get(name)
            distribution = distribution_of(described) if described else None
            if distribution is None or not all(_contains(distribution, v) for v in taken):
                distribution = _inferred_distribution(taken)
            out[name] = distribution
        return out


def _contains(distribution: Any, value: Any) -> bool:
    try:
        return bool(distribution._contains(distribution.to_internal_repr(value)))
    except (ValueError, TypeError):
        return False


def _times(record: Mapping[str, Any]) -> tuple[datetime | None, datetime | None]:
    try:
        end = datetime.fromisoformat(str(record["timestamp"]))
    except (KeyError, ValueError):
        return None, None
    return end - timedelta(seconds=float(record.get("elapsed_s") or 0.0)), end


def study_from_trials(records: Sequence[Mapping[str, Any]], space: ReportSpace | None = None,
                      target_name: str = "time (ns)"):
    """An in-memory study holding every trial, numbered as in ``trials.jsonl``.

    Args:
        records: the trial records.
        space: the plotted parameters (default: inferred from the records).
        target_name: the objective's name (``study.metric_names``).

    Returns:
        The study: verified trials COMPLETE with their metric, the others FAIL with their ``status`` and
        ``error`` as user attributes; each with the time it ran (the timeline).
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = space or ReportSpace(None, records)
    study = optuna.create_study(direction="minimize", study_name="mneme-tune-report")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([target_name])
    for r in sorted(records, key=lambda r: r.get("trial", 0)):
        params = space.params(r)
        verified = r.get("status") == "verified" and r.get("metric") is not None
        trial = optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE if verified else optuna.trial.TrialState.FAIL,
            value=float(r["metric"]) if verified else None, params=params,
            distributions={k: space.distributions[k] for k in params},
            user_attrs={"status": r.get("status"), "error": r.get("error") or "", "speedup": r.get("speedup"),
                        "hash": r.get("hash"), "trial": r.get("trial")})
        start, end = _times(r)
        if start is not None:
            trial.datetime_start, trial.datetime_complete = start, end
        study.add_trial(trial)
    return study


def _pareto_study(records: Sequence[Mapping[str, Any]], space: ReportSpace, config: Mapping[str, Any]):
    """The NSGA-II run's objectives as a multi-objective study, in their directions (None for other runs)."""
    import optuna

    objective = Objective.from_config(dict(config))
    directions = list(objective.directions)
    points = [r for r in iter_verified(records) if len(r.get("objective_values") or []) == len(directions)]
    if config.get("sampler") != "nsga2" or len(directions) < 2 or not points:
        return None, []
    names = objective.metric_names
    study = optuna.create_study(directions=directions, study_name="mneme-tune-pareto")
    for r in points:
        params = space.params(r)
        study.add_trial(optuna.trial.create_trial(
            values=[float(v) for v in r["objective_values"]], params=params,
            distributions={k: space.distributions[k] for k in params}, user_attrs={"trial": r.get("trial")}))
    return study, names


def plotting_for(results: ResultsDirectory, records: Sequence[Mapping[str, Any]]) -> Plotting:
    """What the plots of a results directory are drawn from.

    Args:
        results: the directory (its ``config.json``, ``search_space.json`` and ``baseline.json`` are read).
        records: its trial records.

    Returns:
        The study of every trial, the varying parameters, the failures, the baseline's metric and, for an
        NSGA-II run, the two-objective study.
    """
    config = results.read_json("config.json") or {}
    described = (results.read_json("search_space.json") or {}).get("dimensions")
    space = ReportSpace(described, records)
    target_name = f"{config.get('metric', 'mean')} time (ns)"
    study = study_from_trials(records, space, target_name)
    completed = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    varying = [name for name in space.distributions
               if len({json.dumps(t.params.get(name)) for t in completed}) > 1]
    failures = [(t.number, str(t.user_attrs.get("status")), str(t.user_attrs.get("error") or ""))
                for t in study.get_trials(deepcopy=False) if t.state.name == "FAIL"]
    pareto, names = _pareto_study(records, space, config)
    return Plotting(study=study, target_name=target_name, varying=varying,
                    baseline_metric=(results.read_json("baseline.json") or {}).get("metric"),
                    failures=failures, pareto=pareto, metric_names=names)


def write_report(run_dir: str | Path) -> dict[str, Any]:
    """Write the report under ``DIR/report/``.

    Args:
        run_dir: a results directory of ``mneme tune``.

    Returns:
        ``written`` (paths), ``skipped`` (what was not drawn, and why), the trial counts and the
        tolerance used; also written as ``report.json``.

    Raises:
        ConfigurationError: the directory holds no trials.
        NotAvailableError: neither matplotlib nor plotly is installed.
        ResultsDirectoryError: ``DIR/report`` cannot be written.
    """
    results = ResultsDirectory(run_dir)
    if not (results.path / TRIALS).exists():
        raise ConfigurationError(f"{results.path} holds no {TRIALS}; give the --results-dir of a tuning run")
    records = results.load_trials()
    if not records:
        raise ConfigurationError(f"{results.path} holds no trials yet; nothing to report")
    have_mpl = importlib.util.find_spec("matplotlib") is not None
    have_plotly = importlib.util.find_spec("plotly") is not None
    if not (have_mpl or have_plotly):
        raise NotAvailableError(
            "the report needs matplotlib (PNG) or plotly (HTML): pip install 'mneme[plots]' "
            "(matplotlib) and/or pip install plotly"
        )
    plotting = plotting_for(results, records)
    out = results.path / REPORT_DIR
    written: list[str] = []
    skipped: list[str] = []
    if not have_mpl:
        skipped.append("PNG plots: install matplotlib (pip install 'mneme[plots]')")
    if not have_plotly:
        skipped.append("HTML plots: install plotly (pip install plotly)")
    try:
        out.mkdir(exist_ok=True)
        for plot in PLOTS:
            reason = applicable(plotting, plot)
            if reason:
                skipped.append(f"{plot}: {reason}")
                continue
            if have_mpl:
                written += _try(skipped, plot, "png", lambda p=plot: str(write_png(plotting, p, out)))
            if have_plotly:
                written += _try(skipped, plot, "html", lambda p=plot: str(write_html(plotting, p, out)))
        summary = {"written": written, "skipped": skipped, "trials": len(records),
                   "verified_trials": len(plotting.completed), "failed_trials": len(plotting.failures),
                   "plotted_parameters": plotting.varying, **verification_counts(records),
                   "tolerance": (results.read_json("baseline.json") or {}).get("tolerance")}
        index = out / "index.html"
        index.write_text(index_html(results, records, plotting, written, skipped))
        written.append(str(index))
        (out / "report.json").write_text(json.dumps(summary, indent=2) + "\n")
    except OSError as exc:
        raise cannot_write(out, exc) from exc
    return summary


def _try(skipped: list[str], plot: str, kind: str, write: Callable[[], str]) -> list[str]:
    try:
        return [write()]
    except OSError:
        raise
    except Exception as exc:  # noqa: BLE001 - one plot failing must not lose the others
        skipped.append(f"{plot}.{kind}: {type(exc).__name__}: {exc}")
        return []


def index_html(results: ResultsDirectory, records: Sequence[Mapping[str, Any]], plotting: Plotting,
               written: Sequence[str], skipped: Sequence[str]) -> str:
    """The report's front page.

    Args:
        results: the results directory.
        records: its trial records.
        plotting: what the plots were drawn from.
        written: the files written so far.
        skipped: what was not drawn, and why.

    Returns:
        HTML: the run, its best configurations against the baseline, its failures by status, the plots;
        every resource it names is beside it.
    """
    e = html.escape
    config = results.read_json("config.json") or {}
    summary = results.read_json("summary.json") or {}
    kernel = config.get("kernel") or {}
    baseline = plotting.baseline_metric
    counts = verification_counts(records)
    statuses = Counter(r.get("status") for r in records)
    verified = statuses.get("verified", 0)
    coverage = summary.get("coverage") or {}
    covered = (f"{coverage['evaluated']} of {coverage['configurations']} configurations of the space evaluated"
               if coverage.get("configurations") else "")
    facts = [f"{len(records)} trials: {verified} verified ({counts['verified_exact']} exactly, "
             f"{counts['verified_within_tolerance']} within tolerance), {len(records) - verified} failed",
             f"sampler {config.get('sampler', '?')}, metric {config.get('metric', '?')}, objective "
             f"{config.get('objective', '?')}", f"stopped: {summary.get('stopped', '?')}"
             + (f" ({'complete' if summary.get('complete') else 'not complete'}: {covered})" if covered else ""),
             f"baseline (the recorded launch): {format_ns(baseline)}"]
    rows = "".join(
        f"<tr><td>{row['rank']}</td><td>{row['trial']}</td><td>{e(format_ns(row['metric']))}</td>"
        f"<td>{row['speedup']:.3f}</td><td><code>{e(describe_params(row['params']))}</code></td></tr>"
        if row.get("speedup") else
        f"<tr><td>{row['rank']}</td><td>{row['trial']}</td><td>{e(format_ns(row['metric']))}</td><td>-</td>"
        f"<td><code>{e(describe_params(row['params']))}</code></td></tr>"
        for row in top_configurations(records, baseline))
    baseline_row = (f"<tr class=baseline><td></td><td>baseline</td><td>{e(format_ns(baseline))}</td><td>1.000</td>"
                    "<td>the recorded launch</td></tr>" if baseline else "")
    first_error = {}
    for r in records:
        if r.get("status") != "verified":
            first_error.setdefault(r.get("status"), r)
    failures = "".join(
        f"<tr><td>{e(str(status))}</td><td>{n}</td><td>{first_error[status].get('trial')}</td>"
        f"<td><code>{e(str(first_error[status].get('error') or '')[:300])}</code></td></tr>"
        for status, n in statuses.most_common() if status != "verified")
    plots = []
    names = {Path(w).name for w in written}
    for plot in PLOTS:
        html_name, png_name = f"{plot}.html", f"{plot}.png"
        if html_name not in names and png_name not in names:
            continue
        link = f" (<a href='{html_name}'>interactive</a>)" if html_name in names else ""
        image = f"<img src='{png_name}' alt='{plot}'>" if png_name in names else ""
        plots.append(f"<h3>{plot.replace('_', ' ')}{link}</h3>{image}")
    notes = "".join(f"<li>{e(s)}</li>" for s in skipped)
    title = f"mneme tune report: {kernel.get('name', '')} instance {kernel.get('record_id', config.get('record_id', ''))}"
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{e(title)}</title><style>body{{font-family:sans-serif;margin:2em}}"
        "table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:2px 8px;text-align:left}"
        "tr.baseline{color:#666}img{max-width:100%}</style></head><body>"
        f"<h1>{e(title)}</h1><ul>{''.join(f'<li>{e(f)}</li>' for f in facts)}</ul>"
        "<h2>Best configurations against the baseline</h2>"
        "<table><tr><th>#</th><th>trial</th><th>time</th><th>speedup</th><th>parameters</th></tr>"
        f"{baseline_row}{rows}</table>"
        + (f"<h2>Failures</h2><table><tr><th>status</th><th>trials</th><th>first trial</th><th>error</th></tr>"
           f"{failures}</table>" if failures else "")
        + f"<h2>Plots</h2>{''.join(plots)}"
        + (f"<h2>Not drawn</h2><ul>{notes}</ul>" if notes else "")
        + "</body></html>\n"
    )


def report_command(run_dir: str, out: TextIO) -> int:
    """``mneme tune report DIR``: write the report and say what was written.

    Args:
        run_dir: the results directory.
        out: where to print.

    Returns:
        The exit status (0).
    """
    summary = write_report(run_dir)
    for path in summary["written"]:
        print(f"wrote {path}", file=out)
    for note in summary["skipped"]:
        print(f"skipped {note}", file=out)
    policies = (summary.get("tolerance") or {}).get("policies") or {}
    bounds = ", ".join(f"{label}={spec}" for label, spec in policies.items()) or "none needed (bit-exact)"
    print(f"verified: {summary['verified_exact']} exactly, {summary['verified_within_tolerance']} within "
          f"tolerance; derived tolerance: {bounds}", file=out)
    print(f"open {Path(run_dir) / REPORT_DIR / 'index.html'} (works offline)", file=out)
    return 0
