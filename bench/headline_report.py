"""The headline's outputs: one table (plain text, pastes into the README as
Markdown), the machine-readable JSON, and a PNG chart.

Every function here takes the results dict bench/headline.py builds, in which
any stage may hold ``{"error": "..."}`` instead of measurements; the table
shows such errors in place, and the chart leaves the stage out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

# The reference's published figures (AMD/HIP Mneme; see docs/examples.md for sources).
REFERENCE = {
    "vecadd_configs_per_s": 11.3,  # 80 configurations in 7.09 s, 5 iterations + 2 warm-ups each
    "vecadd_best_speedup": 1.122,  # default<O1>, blockDim.x = 128
    "minife_observations_per_s": 1.26,  # with its Python interface
    "minife_plain_s": 36.0,
    "minife_record_s": 38.0,
}

HEADERS = ("measurement", "workload", "mneme (this run)", "reference")
# Longer error messages are cut in the table; headline.json keeps them whole.
MAX_ERROR_CELL = 110


def _err(stage: Mapping[str, Any] | None) -> str | None:
    """The cell text of a stage without measurements (not run, skipped, failed); None when it has them."""
    if stage is None:
        return "not run"
    if "skipped" in stage:
        text = f"skipped: {stage['skipped']}"
    elif "error" in stage:
        text = f"error: {stage['error']}"
    else:
        return None
    return text if len(text) <= MAX_ERROR_CELL else text[: MAX_ERROR_CELL - 3] + "..."


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} us"


def table_rows(results: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """The table, one row per (measurement, workload)."""
    rows: list[tuple[str, str, str, str]] = []
    workloads: Mapping[str, Any] = results.get("workloads", {})
    if results.get("build", {}).get("error"):
        rows.append(("build examples", "all", f"error: {results['build']['error']}", "-"))

    for name, w in workloads.items():
        rec = w.get("recording")
        reference = (
            f"{REFERENCE['minife_plain_s']:.0f} s -> {REFERENCE['minife_record_s']:.0f} s "
            f"(x{REFERENCE['minife_record_s'] / REFERENCE['minife_plain_s']:.2f}, MiniFE)"
            if name == "minife_cg"
            else "-"
        )
        if _err(rec):
            rows.append(("recording: app wall time without -> with", name, _err(rec), reference))
        else:
            rows.append((
                "recording: app wall time without -> with",
                name,
                f"{rec['plain_median_s']:.2f} s -> {rec['recorded_median_s']:.2f} s (x{rec['overhead_ratio']:.2f}"
                + (f", {rec['record_bytes'] / 1e6:.1f} MB recorded)" if rec.get("record_bytes") else ")"),
                reference,
            ))

    for name, w in workloads.items():
        fid = w.get("fidelity")
        if _err(fid):
            rows.append(("replay fidelity: replay / app kernel time", name, _err(fid), "-"))
            continue
        rows.append(("replay fidelity: replay / app kernel time", name, fidelity_text(fid), "-"))

    tuning: Mapping[str, Any] = results.get("tuning", {})
    labels = {
        "vecadd": ("vecadd (reference space)", f"{REFERENCE['vecadd_configs_per_s']} configs/s"),
        "minife_cg": ("minife_cg spmv_csr", f"{REFERENCE['minife_observations_per_s']} observations/s (MiniFE)"),
    }
    labels = {k: v for k, v in labels.items() if k in tuning}  # workloads not selected have no row
    for key, (label, reference) in labels.items():
        t = tuning.get(key)
        if _err(t):
            rows.append(("tuning: verified configurations/s", label, _err(t), reference))
            continue
        rows.append((
            "tuning: verified configurations/s",
            label,
            f"{t['verified_per_s']:.1f} ({t['verified']}/{t['configurations']} verified in {t['sweep_s']:.2f} s"
            + (f": {t['passes']} sweeps of {t['space_configurations']}" if t.get("passes", 1) > 1 else "")
            + f", {t['iterations']}+{t['warmup']} launches each)",
            reference,
        ))
    for key, (label, _) in labels.items():
        t = tuning.get(key)
        if _err(t) or not t.get("best"):
            continue
        best = t["best"]
        compile_key = t["compile_dimension"]
        reference = f"x{REFERENCE['vecadd_best_speedup']:.2f}" if key == "vecadd" else "-"
        rows.append((
            "tuning: best speedup over the recorded launch",
            label,
            f"x{best['speedup']:.2f} (blockDim.x={best['block_dim_x']}, {compile_key}={best[compile_key]}, "
            f"{_us(best['mean_us'])} vs {_us(t['baseline_mean_us'])})",
            reference,
        ))
    return rows


def fidelity_text(fid: Mapping[str, Any]) -> str:
    replay = fid.get("replay_median_us")
    app = fid.get("app_median_us")
    recorder = fid.get("recorder_app_kernel_time_us")
    parts = []
    if replay is not None and app:
        parts.append(f"{_us(replay)} / {_us(app)} = {replay / app:.3f}")
        if recorder:
            parts.append(f"recorder's in-app time {_us(recorder)}")
    elif replay is not None and recorder:
        parts.append(f"{_us(replay)} / {_us(recorder)} (recorder's in-app time) = {replay / recorder:.3f}")
    elif replay is not None:
        parts.append(f"{_us(replay)} (no in-app time to compare)")
    if not fid.get("verified", False):
        parts.append(f"NOT VERIFIED ({fid.get('status')}: {fid.get('error')})")
    return "; ".join(parts) or "no kernel time measured"


def format_table(rows: list[tuple[str, str, str, str]]) -> str:
    """A Markdown table with aligned columns (readable in a terminal and in the README)."""
    cells = [HEADERS, *rows]
    widths = [max(len(str(r[i])) for r in cells) for i in range(len(HEADERS))]

    def line(row):
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |"

    return "\n".join([line(HEADERS), "| " + " | ".join("-" * w for w in widths) + " |", *(line(r) for r in rows)])


def write_json(results: Mapping[str, Any], path: Path) -> None:
    path.write_text(json.dumps(results, indent=2, sort_keys=False, default=str) + "\n")


def write_chart(results: Mapping[str, Any], path: Path) -> str | None:
    """Write the PNG; returns None, or why no chart was written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'mneme[plots]'); no chart written"

    workloads = results.get("workloads", {})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    meta = results.get("meta", {})
    fig.suptitle(f"mneme headline: {meta.get('gpu', 'unknown GPU')}, {meta.get('date', '')}")

    rec = {n: w["recording"] for n, w in workloads.items() if w.get("recording") and not _err(w["recording"])}
    ax = axes[0]
    if rec:
        names = list(rec)
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [rec[n]["plain_median_s"] for n in names], 0.4, label="without recording")
        ax.bar([x + 0.2 for x in xs], [rec[n]["recorded_median_s"] for n in names], 0.4, label="mneme record")
        ax.set_xticks(list(xs), names, rotation=20)
        ax.legend()
    ax.set_title("application wall time (s)")

    fid = {
        n: w["fidelity"] for n, w in workloads.items()
        if w.get("fidelity") and not _err(w["fidelity"]) and w["fidelity"].get("ratio")
    }
    ax = axes[1]
    if fid:
        names = list(fid)
        ax.bar(names, [fid[n]["ratio"] for n in names], color="tab:green")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhspan(0.97, 1.03, color="grey", alpha=0.2, label="within 3%")
        ax.tick_params(axis="x", rotation=20)
        ax.legend()
    ax.set_title("replay / in-application kernel time")

    tuning = results.get("tuning", {})
    ax = axes[2]
    labels, ours, theirs = [], [], []
    for key, ref_key in (("vecadd", "vecadd_configs_per_s"), ("minife_cg", "minife_observations_per_s")):
        t = tuning.get(key)
        if t and not _err(t) and t.get("verified_per_s") is not None:
            labels.append(key)
            ours.append(t["verified_per_s"])
            theirs.append(REFERENCE[ref_key])
    if labels:
        xs = range(len(labels))
        ax.bar([x - 0.2 for x in xs], ours, 0.4, label="mneme (NVIDIA)")
        ax.bar([x + 0.2 for x in xs], theirs, 0.4, label="reference (AMD/HIP)")
        ax.set_xticks(list(xs), labels)
        ax.set_yscale("log")
        ax.legend()
    ax.set_title("verified configurations per second")

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
