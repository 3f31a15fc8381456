"""The fingerprint of a run: everything that gives its trials their meaning.

A trial record means something only under the settings it was measured with: the kernel instance, the
search space's dimensions (what its parameters are) and what they derive, the objective and its metric,
the launches per replay and the tolerance the result was verified with. ``config.json`` carries these as
``fingerprint``; ``--resume`` compares them with the run's own and refuses to continue a directory whose
fingerprint differs, saying what differs (:func:`differences`), unless ``--force`` starts a new run beside
it. Everything else (sampler, seed, workers, servers, budget, timeout) may change between a run and its
resumption.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

VERSION = 1

#: Settings that give trials their meaning, by section, with the flag that sets each (for messages).
SETTINGS = {
    "objective": {"objective": "--objective", "metric": "--metric", "secondary_objective": "--secondary-objective"},
    "measurement": {"iterations": "--iterations", "warmup": "--warmup"},
    "verification": {"tolerance": "--tolerance", "tolerance_policies": "--tolerance SEL=SPEC/--tolerance-file",
                     "tolerance_runs": "--tolerance-runs"},
}
KERNEL_LABELS = {"name": "kernel name", "static_hash": "kernel static hash (another recording)",
                 "record_id": "--record-id"}
SPACE_LABELS = {"class": "search space (--space-module)", "space_args": "--space-arg",
                "baseline": "baseline configuration", "settings": "built-in space settings"}


def settings_fingerprint(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The sections of the fingerprint that the resolved settings alone give (known before the recording
    is read: a resume can be refused on them before any server starts).

    Args:
        settings: ``TuneOptions.to_dict()`` (or ``config.json``).

    Returns:
        ``{"objective": ..., "measurement": ..., "verification": ...}``.
    """
    out: dict[str, Any] = {}
    for section, keys in SETTINGS.items():
        out[section] = {key: settings.get(key) for key in keys}
    if settings.get("sampler") != "nsga2":  # the second objective exists only for NSGA-II
        out["objective"]["secondary_objective"] = None
    out["verification"]["tolerance_policies"] = dict(settings.get("tolerance_policies") or {})
    return out


def run_fingerprint(settings: Mapping[str, Any], kernel: Mapping[str, Any],
                    space: Mapping[str, Any]) -> dict[str, Any]:
    """The whole fingerprint of a run.

    Args:
        settings: the resolved settings (``TuneOptions.to_dict()``, or an earlier run's ``config.json``).
        kernel: the kernel identity (``name``, ``static_hash``, ``record_id``).
        space: the search space's description (``search_space.json``).

    Returns:
        The fingerprint written to ``config.json`` (JSON values only).
    """
    builtin = space.get("builtin") or {}
    return {
        "version": VERSION,
        "kernel": {key: str(kernel.get(key)) for key in KERNEL_LABELS},
        **settings_fingerprint(settings),
        "space": {
            "class": _class_name(space.get("class")),
            "dimensions": space.get("dimensions") or {},
            "settings": builtin.get("settings"),
            "space_args": dict(settings.get("space_args") or {}),
            "baseline": space.get("baseline"),
        },
    }


def _class_name(name: Any) -> Any:
    """A space class's name; for a class loaded from a file (``--space-module PATH:CLASS``) without the
    module name the loader made up for the file, which earlier versions made differently in every process."""
    return re.sub(r"^mneme_space_[0-9a-f]+\.", "", name) if isinstance(name, str) else name


def stored_fingerprint(config: Mapping[str, Any], space: Mapping[str, Any] | None) -> dict[str, Any]:
    """The fingerprint of the run in a results directory.

    Args:
        config: its ``config.json``.
        space: its ``search_space.json`` (None: only the settings' sections are compared).

    Returns:
        The fingerprint ``config.json`` carries, or, for a directory written before fingerprints, the one
        its ``config.json`` and ``search_space.json`` give.
    """
    stored = config.get("fingerprint")
    if isinstance(stored, Mapping) and stored.get("version") == VERSION:
        return dict(stored)
    kernel = config.get("kernel") or {"record_id": config.get("record_id")}
    return run_fingerprint(config, kernel, space or {})


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs between two fingerprints (or the sections of them both have), one line each.

    Args:
        old: the fingerprint of the run in the directory.
        new: this run's.

    Returns:
        Lines such as ``--metric: mean -> median`` or ``dimension passes: CategoricalDistribution does not
        support dynamic value space. (['default<O3>'] -> ['default<O1>', ...])``; empty when they agree.
    """
    lines: list[str] = []
    kernel_old, kernel_new = old.get("kernel"), new.get("kernel")
    if kernel_old is not None and kernel_new is not None:
        lines += _mapping_lines(kernel_old, kernel_new, KERNEL_LABELS)
    for section, labels in SETTINGS.items():
        if section in old and section in new:
            lines += _mapping_lines(old[section], new[section], labels)
    space_old, space_new = old.get("space"), new.get("space")
    if space_old is not None and space_new is not None:
        lines += dimension_differences(space_old.get("dimensions") or {}, space_new.get("dimensions") or {})
        for key, label in SPACE_LABELS.items():
            if key == "settings":
                lines += _mapping_lines(space_old.get(key) or {}, space_new.get(key) or {},
                                        {}, prefix="built-in space setting ")
            elif _canonical(space_old.get(key)) != _canonical(space_new.get(key)):
                lines.append(f"{label}: {_short(space_old.get(key))} -> {_short(space_new.get(key))}")
    return lines


def dimension_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The dimensions that differ.

    Args:
        old: the earlier run's dimensions (``search_space.json``'s ``dimensions``).
        new: this run's.

    Returns:
        One line per dimension that differs: gone, new, incompatible as Optuna judges a parameter's
        distributions (``optuna.distributions.check_distribution_compatibility``), or otherwise changed
        (a range).
    """
    lines = []
    for name in list(old) + [n for n in new if n not in old]:
        if name not in new:
            lines.append(f"dimension {name}: not in the search space any more ({_describe(old[name])})")
        elif name not in old:
            lines.append(f"dimension {name}: new in the search space ({_describe(new[name])})")
        elif _canonical(old[name]) != _canonical(new[name]):
            reason = _incompatibility(old[name], new[name])
            change = f"{_describe(old[name])} -> {_describe(new[name])}"
            lines.append(f"dimension {name}: {reason} ({change})" if reason else f"dimension {name}: {change}")
    return lines


def _incompatibility(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """Optuna's reason why a study could not hold both distributions, or "" when it could."""
    from optuna.distributions import check_distribution_compatibility

    try:
        check_distribution_compatibility(distribution_of(old), distribution_of(new))
    except ValueError as exc:
        return str(exc)
    return ""


def distribution_of(described: Mapping[str, Any]):
    """The Optuna distribution of a described dimension.

    Args:
        described: the dimension as ``search_space.json`` describes it (``Param.describe``).

    Returns:
        Its ``IntDistribution``, ``FloatDistribution`` or ``CategoricalDistribution``.
    """
    import optuna.distributions as d

    kind = described.get("type")
    if kind == "int":
        low, step = int(described["low"]), int(described.get("step") or 1)
        high = low + (int(described["high"]) - low) // step * step
        return d.IntDistribution(low, high, step=step, log=bool(described.get("log")))
    if kind == "real":
        return d.FloatDistribution(float(described["low"]), float(described["high"]), step=described.get("step"),
                                   log=bool(described.get("log")))
    if kind == "fixed":
        return d.CategoricalDistribution([described.get("value")])
    return d.CategoricalDistribution(list(described.get("choices") or []))


def _mapping_lines(old: Mapping[str, Any], new: Mapping[str, Any], labels: Mapping[str, str],
                   prefix: str = "") -> list[str]:
    keys = list(labels) or sorted(set(old) | set(new))
    return [f"{labels.get(key) or prefix + key}: {_short(old.get(key))} -> {_short(new.get(key))}"
            for key in keys if _canonical(old.get(key)) != _canonical(new.get(key))]


def _describe(described: Mapping[str, Any]) -> str:
    kind = described.get("type")
    if kind in ("int", "real"):
        step = described.get("step")
        return f"{described.get('low')}..{described.get('high')}" + (f" step {step}" if step not in (None, 1) else "") \
            + (" log" if described.get("log") else "")
    if kind == "fixed":
        return f"fixed {described.get('value')!r}"
    return _short(list(described.get("choices") or []))


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _short(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."
