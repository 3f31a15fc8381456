"""``mneme tune report DIR DIR ...`` and ``mneme tune report --optuna-storage URL``: one view of a search
that several processes ran together (a shared Optuna study, each process with its own results directory).

From results directories: every process's ``trials.jsonl`` (read, never changed), merged: trials per
directory, distinct configurations, any configuration evaluated twice, statuses, and the best verified
trial with the directory it came from. From the storage: the study's trials as Optuna holds them (the
user attributes each process attached), evaluated trials apart from duplicates that took a claim's values.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Sequence, TextIO

from mneme.errors import ConfigurationError
from tuner.results.directory import TRIALS, dumps

MERGED_FILE = "merged_summary.json"


def read_trials(directory: str | Path) -> list[dict[str, Any]]:
    """The complete records of ``DIR/trials.jsonl`` (a partial last line of a running process is skipped)."""
    path = Path(directory) / TRIALS
    if not path.is_file():
        raise ConfigurationError(f"{directory} holds no {TRIALS}; give the --results-dir of a `mneme tune` run")
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _best(entries: list[tuple[str, dict[str, Any]]]) -> dict[str, Any] | None:
    verified = [(where, r) for where, r in entries if r.get("status") == "verified" and r.get("metric") is not None]
    if not verified:
        return None
    where, r = min(verified, key=lambda item: item[1]["metric"])
    return {"from": where, "trial": r.get("trial"), "params": r.get("params"), "hash": r.get("hash"),
            "metric": r["metric"], "speedup": r.get("speedup"), "configuration": r.get("configuration")}


def merged_summary(directories: Sequence[str | Path]) -> dict[str, Any]:
    entries = [(str(d), r) for d in directories for r in read_trials(d)]
    hashes = Counter(r.get("hash") for _, r in entries)
    return {
        "source": "results directories",
        "trials": len(entries),
        "per_source": dict(Counter(where for where, _ in entries)),
        "distinct_configurations": len(hashes),
        "evaluated_twice": sorted(h for h, n in hashes.items() if n > 1),
        "statuses": dict(Counter(r.get("status") for _, r in entries)),
        "best": _best(entries),
    }


def study_summary(storage_url: str, study_name: str | None) -> dict[str, Any]:
    import optuna

    from tuner.strategies.shared_study import DUPLICATE_ATTR, HASH_ATTR, open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(storage_url)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    if study_name is None:
        if len(names) != 1:
            raise ConfigurationError(f"{storage_url} holds studies {names or 'none'}; name one with --study-name")
        study_name = names[0]
    if study_name not in names:
        raise ConfigurationError(f"{storage_url} holds no study {study_name!r}; its studies: {names or 'none'}")
    study = optuna.load_study(study_name=study_name, storage=storage)
    evaluated, duplicates, states = [], 0, Counter()
    for t in study.get_trials(deepcopy=False):
        states[t.state.name] += 1
        if DUPLICATE_ATTR in t.system_attrs:
            duplicates += 1
        elif HASH_ATTR in t.system_attrs and "status" in t.user_attrs:
            details = t.user_attrs.get("mneme") or {}
            evaluated.append((details.get("worker", "?"), {**details, **t.user_attrs, "trial": t.number,
                                                           "params": t.params}))
    hashes = Counter(r.get("hash") for _, r in evaluated)
    return {
        "source": f"{storage_url} study {study_name}",
        "trials": len(evaluated),
        "per_source": dict(Counter(where for where, _ in evaluated)),
        "distinct_configurations": len(hashes),
        "evaluated_twice": sorted(h for h, n in hashes.items() if n > 1),
        "statuses": dict(Counter(r.get("status") for _, r in evaluated)),
        "duplicate_trials": duplicates,
        "trial_states": dict(states),
        "best": _best(evaluated),
    }


def print_summary(doc: dict[str, Any], out: TextIO) -> None:
    print(f"{doc['source']}: {doc['trials']} evaluated trials, {doc['distinct_configurations']} distinct "
          f"configurations, {len(doc['evaluated_twice'])} evaluated twice", file=out)
    for where, n in sorted(doc["per_source"].items()):
        print(f"  {where}: {n}", file=out)
    print("statuses: " + ", ".join(f"{k}={v}" for k, v in sorted(doc["statuses"].items(), key=str)), file=out)
    if "trial_states" in doc:
        print(f"study trials: {dict(sorted(doc['trial_states'].items()))} ({doc['duplicate_trials']} duplicates "
              "told their claim's values)", file=out)
    best = doc["best"]
    if best is None:
        print("no verified trial", file=out)
    else:
        speedup = f" speedup={best['speedup']:.3f}" if best.get("speedup") else ""
        print(f"BEST: {json.dumps(best['params'])} metric={best['metric']}{speedup} (from {best['from']})", file=out)


def report_command(directories: Sequence[str], storage: str | None, study_name: str | None,
                   write_to: str | None, out: TextIO) -> int:
    """The merged report; ``write_to`` (``--results-dir``) also gets it as ``merged_summary.json``."""
    docs = []
    if directories:
        docs.append(merged_summary(directories))
    if storage:
        docs.append(study_summary(storage, study_name))
    for doc in docs:
        print_summary(doc, out)
    if write_to:
        target = Path(write_to)
        target.mkdir(parents=True, exist_ok=True)
        (target / MERGED_FILE).write_text(dumps(docs if len(docs) > 1 else docs[0], indent=2) + "\n")
        print(f"wrote {target / MERGED_FILE}", file=out)
    return 0
