"""The best configurations of a run against its baseline: rows for the report's index page, the rich table
``mneme tune`` ends with, and ``mneme tune compare``."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence, TextIO

from tuner.progress import describe_params, format_ns
from tuner.results.directory import iter_verified

#: Configurations the tables list.
TOP_N = 10


def top_configurations(records: Iterable[Mapping[str, Any]], baseline_metric: float | None,
                       n: int = TOP_N) -> list[dict[str, Any]]:
    """The ``n`` fastest verified trials, fastest first.

    Args:
        records: trial records (``trials.jsonl``).
        baseline_metric: the current baseline's metric; speedups are computed against it.
        n: how many.

    Returns:
        ``rank``, ``trial``, ``metric``, ``speedup`` (baseline / metric, None without a baseline),
        ``params``, ``hash`` and ``status`` of each.
    """
    ranked = sorted(iter_verified(records), key=lambda r: r["metric"])[:n]
    return [{"rank": i + 1, "trial": r.get("trial"), "metric": r["metric"],
             "speedup": baseline_metric / r["metric"] if baseline_metric else r.get("speedup"),
             "params": r.get("params") or {}, "hash": r.get("hash"), "status": r.get("status")}
            for i, r in enumerate(ranked)]


def pareto_rows(front: Iterable[Mapping[str, Any]], baseline_metric: float | None) -> list[dict[str, Any]]:
    """A multi-objective run's Pareto front as table rows, fastest first, each with its other objective values.

    Args:
        front: the front's entries (``best.json``'s ``pareto_front``: ``trial``, ``metric``,
            ``objective_values``, ``params``...).
        baseline_metric: the current baseline's metric; speedups are computed against it.

    Returns:
        Rows as :func:`top_configurations` makes them, plus ``extra``: the objective values after the first.
    """
    ranked = sorted(front, key=lambda r: r["metric"])
    return [{"rank": i + 1, "trial": r.get("trial"), "metric": r["metric"],
             "speedup": baseline_metric / r["metric"] if baseline_metric else r.get("speedup"),
             "params": r.get("params") or {}, "hash": r.get("hash"), "status": "verified",
             "extra": list((r.get("objective_values") or [])[1:])}
            for i, r in enumerate(ranked)]


def render_top_table(rows: list[dict[str, Any]], baseline_metric: float | None, metric: str, out: TextIO,
                     *, is_tty: bool | None = None, title: str = "", extra_headers: Sequence[str] = ()) -> None:
    """Print ``rows`` (:func:`top_configurations`, :func:`pareto_rows`) as a rich table, the baseline first.

    Args:
        rows: the configurations.
        baseline_metric: the baseline's metric (its row; None: no row).
        metric: the metric's name (``mean``...), for the header.
        out: where to print.
        is_tty: a terminal (colours, its width); None: ``out.isatty()``.
        title: the table's title.
        extra_headers: a column for each of the rows' ``extra`` values (other objectives), after the speedup.
    """
    from rich.console import Console
    from rich.table import Table

    tty = out.isatty() if is_tty is None else is_tty
    console = Console(file=out, force_terminal=tty, width=None if tty else 160, highlight=False)
    table = Table(title=title or None, title_justify="left")
    for header, justify in (("#", "right"), ("trial", "right"), (f"{metric} time", "right"),
                            ("speedup", "right"), *((h, "right") for h in extra_headers), ("parameters", "left")):
        table.add_column(header, justify=justify, overflow="fold")
    if baseline_metric is not None:
        table.add_row("", "baseline", format_ns(baseline_metric), "1.000", *("" for _ in extra_headers),
                      "the recorded launch", style="dim")
    for row in rows:
        speedup = f"{row['speedup']:.3f}" if row.get("speedup") else "-"
        extra = list(row.get("extra") or [])[:len(extra_headers)]
        extra += [None] * (len(extra_headers) - len(extra))
        table.add_row(str(row["rank"]), str(row["trial"]), format_ns(row["metric"]), speedup,
                      *("-" if v is None else f"{v:.4g}" for v in extra), describe_params(row["params"]))
    console.print(table)
