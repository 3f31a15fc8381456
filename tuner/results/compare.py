"""``mneme tune compare A B``: two results directories side by side.

What differs in what their trials mean (the fingerprints in ``config.json``: kernel, space, objective,
measurement, tolerance), each run's baseline and best, and the configurations both evaluated: how their
times compare (a run on another GPU, driver or day) and where one verified and the other did not.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Mapping, TextIO

from mneme.errors import ConfigurationError
from tuner.progress import describe_params, format_ns
from tuner.results.directory import TRIALS, ResultsDirectory
from tuner.results.fingerprint import differences, stored_fingerprint
from tuner.results.table import top_configurations

#: Configurations listed where the two runs disagree, at most.
SHOWN = 5


def _run(path: str | Path) -> dict[str, Any]:
    results = ResultsDirectory(path)
    if not (results.path / TRIALS).is_file():
        raise ConfigurationError(f"{results.path} holds no {TRIALS}; give the --results-dir of a `mneme tune` run")
    config = results.read_json("config.json") or {}
    records = results.load_trials()
    baseline = (results.read_json("baseline.json") or {}).get("metric")
    top = top_configurations(records, baseline, n=1)
    summary = results.read_json("summary.json") or {}
    return {
        "path": str(results.path),
        "kernel": config.get("kernel") or {},
        "device": config.get("device") or {},
        "sampler": config.get("sampler"),
        "metric": config.get("metric"),
        "trials": len(records),
        "verified": sum(r.get("status") == "verified" for r in records),
        "complete": summary.get("complete"),
        "baseline_metric": baseline,
        "best": top[0] if top else None,
        "fingerprint": stored_fingerprint(config, results.read_json("search_space.json")),
        "_records": {r["hash"]: r for r in records if r.get("hash")},
    }


def compare_runs(a: str | Path, b: str | Path) -> dict[str, Any]:
    """Compare two results directories.

    Args:
        a: the first (the reference).
        b: the second.

    Returns:
        ``runs`` (each run's kernel, counts, baseline and best), ``differences`` (what differs in what
        their trials mean, as ``--resume`` would say it), ``common`` (configurations both evaluated: how
        many, how many both verified, the median and extremes of B's time / A's), ``disagreements``
        (configurations verified in one and not the other) and ``best_ratio`` (B's best time / A's).
    """
    first, second = _run(a), _run(b)
    shared = first["_records"].keys() & second["_records"].keys()
    ratios, disagreements = [], []
    for key in sorted(shared):
        ra, rb = first["_records"][key], second["_records"][key]
        if ra.get("status") == rb.get("status") == "verified" and ra.get("metric") and rb.get("metric"):
            ratios.append(rb["metric"] / ra["metric"])
        elif (ra.get("status") == "verified") != (rb.get("status") == "verified"):
            disagreements.append({"hash": key, "params": ra.get("params"), "a": ra.get("status"),
                                  "b": rb.get("status"), "error": ra.get("error") or rb.get("error")})
    best_a, best_b = first["best"], second["best"]
    return {
        "runs": [{k: v for k, v in run.items() if not k.startswith("_") and k != "fingerprint"}
                 for run in (first, second)],
        "differences": differences(first["fingerprint"], second["fingerprint"]),
        "common": {"configurations": len(shared), "both_verified": len(ratios),
                   "median_ratio": statistics.median(ratios) if ratios else None,
                   "min_ratio": min(ratios) if ratios else None, "max_ratio": max(ratios) if ratios else None},
        "disagreements": disagreements,
        "best_ratio": best_b["metric"] / best_a["metric"] if best_a and best_b else None,
    }


def print_comparison(doc: Mapping[str, Any], out: TextIO, *, is_tty: bool | None = None) -> None:
    """Print a comparison.

    Args:
        doc: :func:`compare_runs`'s document.
        out: where to print.
        is_tty: a terminal (colours, its width); None: ``out.isatty()``.
    """
    from rich.console import Console
    from rich.table import Table

    tty = out.isatty() if is_tty is None else is_tty
    console = Console(file=out, force_terminal=tty, width=None if tty else 160, highlight=False)
    a, b = doc["runs"]
    table = Table(title="mneme tune compare", title_justify="left")
    table.add_column("")
    table.add_column("A", overflow="fold")
    table.add_column("B", overflow="fold")

    def best(run: Mapping[str, Any], what: str) -> str:
        top = run["best"]
        if top is None:
            return "-"
        if what == "time":
            return f"{format_ns(top['metric'])} (trial {top['trial']})"
        if what == "speedup":
            return f"{top['speedup']:.3f}" if top.get("speedup") else "-"
        return describe_params(top["params"])

    rows = [("directory", a["path"], b["path"]),
            ("kernel", f"{a['kernel'].get('name')} {a['kernel'].get('record_id')}",
             f"{b['kernel'].get('name')} {b['kernel'].get('record_id')}"),
            ("driver", str(a["device"].get("driver_version", "-")), str(b["device"].get("driver_version", "-"))),
            ("sampler", str(a["sampler"]), str(b["sampler"])),
            ("trials (verified)", f"{a['trials']} ({a['verified']})", f"{b['trials']} ({b['verified']})"),
            ("space covered", str(a["complete"]), str(b["complete"])),
            ("baseline", format_ns(a["baseline_metric"]), format_ns(b["baseline_metric"])),
            ("best", best(a, "time"), best(b, "time")),
            ("best speedup", best(a, "speedup"), best(b, "speedup")),
            ("best parameters", best(a, "params"), best(b, "params"))]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    lines = doc["differences"]
    console.print("settings that give trials their meaning: " + ("the same" if not lines else "they differ"),
                  markup=False)
    for line in lines:
        console.print(f"  {line}", markup=False)
    common = doc["common"]
    if common["both_verified"]:
        console.print(f"{common['configurations']} configurations in both, {common['both_verified']} verified in "
                      f"both: B's time / A's median {common['median_ratio']:.3f} (from {common['min_ratio']:.3f} "
                      f"to {common['max_ratio']:.3f})", markup=False)
    else:
        console.print(f"{common['configurations']} configurations in both, none verified in both", markup=False)
    for item in doc["disagreements"][:SHOWN]:
        console.print(f"  verified in one only: {describe_params(item['params'] or {})}: A {item['a']}, "
                      f"B {item['b']}", markup=False)
    if len(doc["disagreements"]) > SHOWN:
        console.print(f"  and {len(doc['disagreements']) - SHOWN} more", markup=False)
    if doc["best_ratio"] is not None:
        console.print(f"B's best time / A's best time: {doc['best_ratio']:.3f}", markup=False)


def compare_command(a: str, b: str, out: TextIO) -> int:
    """``mneme tune compare A B``.

    Args:
        a: the first results directory.
        b: the second.
        out: where to print.

    Returns:
        The exit status (0).
    """
    print_comparison(compare_runs(a, b), out)
    return 0
