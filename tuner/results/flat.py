"""``mneme tune export DIR --csv``: the trials of a run as one flat table.

One row per record of ``trials.jsonl``, one column per scalar: the record's own fields, then
``param.NAME``, ``objective_value.N``, ``configuration.FIELD`` (``configuration.block.x``...) and
``result.FIELD``. Lists of numbers (a result's launch times) are joined with ``;``; anything else nested
is its JSON text. Columns appear in the order the records first give them.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterable, Mapping, TextIO

from mneme.errors import ConfigurationError
from tuner.errors import cannot_write
from tuner.results.directory import TRIALS, ResultsDirectory

CSV_FILE = "trials.csv"
#: Record fields that become column groups, and their columns' prefix.
GROUPS = {"params": "param", "objective_values": "objective_value", "configuration": "configuration",
          "result": "result"}


def _cell(value: Any) -> Any:
    if isinstance(value, (list, dict)) and not value:
        return ""
    if isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return ";".join(repr(v) if isinstance(v, float) else str(v) for v in value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True)
    return value


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping) and value:
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}", inner, out)
    else:
        out[prefix] = _cell(value)


def flat_row(record: Mapping[str, Any]) -> dict[str, Any]:
    """One record as ``column -> scalar``.

    Args:
        record: a ``trials.jsonl`` record.

    Returns:
        The row (see the module for the columns).
    """
    row: dict[str, Any] = {}
    for key, value in record.items():
        if key not in GROUPS:
            row[key] = _cell(value)
    for key, prefix in GROUPS.items():
        value = record.get(key)
        if key == "objective_values":
            for i, v in enumerate(value or []):
                row[f"{prefix}.{i}"] = v
        elif key == "params":
            for name, v in (value or {}).items():
                row[f"{prefix}.{name}"] = _cell(v)
        elif value is not None:
            _flatten(prefix, value, row)
    return row


def write_csv(records: Iterable[Mapping[str, Any]], out: TextIO) -> int:
    """Write trial records as CSV.

    Args:
        records: the records.
        out: a text stream.

    Returns:
        How many rows were written.
    """
    rows = [flat_row(r) for r in records]
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    writer = csv.DictWriter(out, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return len(rows)


def export_command(run_dir: str, csv_path: str | None, out: TextIO) -> int:
    """``mneme tune export DIR --csv [PATH]``.

    Args:
        run_dir: the results directory.
        csv_path: where the CSV goes: None for ``DIR/trials.csv``, ``-`` for ``out``.
        out: standard output.

    Returns:
        The exit status (0).

    Raises:
        ConfigurationError: the directory holds no trials.
        ResultsDirectoryError: the CSV cannot be written.
    """
    results = ResultsDirectory(run_dir)
    if not (results.path / TRIALS).is_file():
        raise ConfigurationError(f"{results.path} holds no {TRIALS}; give the --results-dir of a `mneme tune` run")
    records = results.load_trials()
    if csv_path == "-":
        write_csv(records, out)
        return 0
    target = Path(csv_path) if csv_path else results.path / CSV_FILE
    try:
        with open(target, "w", newline="", encoding="utf-8") as fh:
            n = write_csv(records, fh)
    except OSError as exc:
        raise cannot_write(target, exc) from exc
    print(f"wrote {target} ({n} trials)", file=out)
    return 0
