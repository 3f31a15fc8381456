"""The resolved settings of one ``mneme tune`` run.

Settings come from three layers, later ones winning: the defaults here, a
YAML file (``--config FILE.yml``, keys are the long flag names with
underscores), and the command line. :func:`resolve_options` merges and
validates them; ``config.json`` and ``--dump-config`` write the result, which
``--config`` reads back unchanged.

Two groups of settings are objects that the run passes whole: how replays
verify (``verification``: :class:`mneme.model.verification.VerificationSettings`,
from ``--tolerance``, ``--tolerance-file``, ``--tolerance-runs``,
``--no-relocate``) and how the replay servers are reached (``connection``:
:class:`replay_server.client.connection.ConnectionSettings`, from ``--servers``,
``--token-file``, ``--tls-ca``, ``--tls-server-name``, ``--keep-servers``,
``--lock-clocks``, ``--server-engine``); what the replays measure besides times
(``measurement``: :class:`mneme.model.measurement.MeasurementSettings`) follows
from ``--objective`` and ``--energy-window``. Settings files and ``config.json``
keep their flags' names (:meth:`TuneOptions.to_dict`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from mneme.errors import ConfigurationError
from mneme.model.measurement import DEFAULT_ENERGY_WINDOW_S, MeasurementSettings
from mneme.model.verification import DEFAULT_RUNS, VerificationSettings
from mneme.replay.metrics import parse_metric_names
from mneme.replay.tolerance import TOLERANCE_MODES, ToleranceOverrides, tolerance_flags, verification_from_flags
from replay_server.client.connection import LOCK_CLOCKS, ConnectionSettings
from tuner.objective import (
    ENERGY_OBJECTIVES,
    SECONDARY_OBJECTIVES,
    Objective,
    counter_names,
    is_counter,
    needs_energy,
    objective_errors,
    objective_names,
)
from tuner.space.builtin import BOOL_MODES, MAX_THREADS_POLICIES, PRESETS
from tuner.space.launch_shapes import LAUNCH_DIMS, LAUNCH_SAFETIES

SAMPLERS = ("exhaustive", "grid", "random", "tpe", "nsga2")
BUDGETED_SAMPLERS = ("random", "tpe", "nsga2")
METRICS = ("mean", "median", "min", "max")
PRUNERS = ("none", "median", "percentile", "hyperband", "successive-halving")
PROTEUS_FILE = "proteus_tuned_kernels.json"

# Built-in-space settings: meaningless with --space-module.
BUILTIN_KEYS = (
    "space_preset", "launch_dim", "launch_safety", "passes", "fixed_passes", "pipeline_file",
    "codegen_opt_range", "fixed_codegen_opt", "specialize_space", "specialize_dims_space",
    "launch_bounds_space", "max_threads_range", "max_threads_policy", "min_blocks_per_sm_range",
    "fixed_min_blocks_per_sm",
)


@dataclass
class TuneOptions:
    """Every setting of a tuning run; field names are the YAML keys."""

    record_database: str | None = None
    record_id: str | None = None
    # search space
    space_module: str | None = None
    space_args: dict[str, Any] = field(default_factory=dict)
    space_preset: str = "standard"
    launch_dim: str | None = None
    launch_safety: str | None = None
    adaptive_invalid_ban: bool = True
    passes: list[str] | None = None
    fixed_passes: str | None = None
    pipeline_file: str | None = None
    codegen_opt_range: list[int] | None = None
    fixed_codegen_opt: int | None = None
    specialize_space: str | None = None
    specialize_dims_space: str | None = None
    launch_bounds_space: str | None = None
    max_threads_range: list[int] | None = None
    max_threads_policy: str | None = None
    min_blocks_per_sm_range: list[int] | None = None
    fixed_min_blocks_per_sm: int | None = None
    # sampling and evaluation
    sampler: str = "exhaustive"
    secondary_objective: str = "registers"
    trials: int | None = None
    seed: int | None = None
    timeout: float | None = None
    warmup: int = 2
    iterations: int = 5
    workers: int = 1
    metric: str = "mean"
    objective: str = "time"  # time, speedup, energy, edp, a hardware counter, or a list of time/energy/edp/counters
    # Hardware counters every trial records (--metrics NAME,...: mneme.replay.metrics), collected after its timed
    # launches; counters --objective ranks by are collected whether or not they are listed.
    metrics: list[str] | None = None
    energy_window: float = DEFAULT_ENERGY_WINDOW_S  # seconds of back-to-back launches per energy measurement
    fail_fast: bool = False
    # How the replay servers are reached (CONNECTION_KEYS): --servers (None: local servers), --token-file,
    # --tls-ca, --tls-server-name; local servers: --keep-servers leaves the ones this run starts running for
    # later runs, exiting after that many idle seconds (0: stop them at the end; live kept servers that match
    # are used in any case, replay_server.kept_servers), --lock-clocks (the local servers lock their GPUs' clocks;
    # kept servers are then not used), --server-engine (tests and benchmarks: module:factory).
    connection: ConnectionSettings = field(default_factory=ConnectionSettings)
    servers_from: str | None = None  # a directory or s3:// prefix where servers announce themselves
    # How replays verify (VERIFICATION_KEYS): --tolerance auto (default: bounds derived for the regions the
    # baseline's own runs show nondeterministic) or exact, --tolerance SEL=SPEC and --tolerance-file (explicit
    # policies, which win over the recording's annotations and the derived bounds), --tolerance-runs,
    # --no-relocate (the recorded heap addresses or the run stops).
    verification: VerificationSettings = field(default_factory=lambda: VerificationSettings(mode="auto"))
    # optuna
    study_name: str | None = None
    optuna_storage: str | None = None
    pruner: str = "none"
    # outputs and run modes
    results_dir: str | None = None
    resume: bool = False
    force: bool = False  # a results directory holding another run: start a new run beside it
    rerun_baseline: bool = False
    print_space: bool = False
    dry_run: bool = False
    baseline_only: bool = False
    dump_config: str | None = None
    quiet: bool = False
    proteus_output: str | bool | None = None  # None: <results>/proteus_tuned_kernels.json; False: off

    def to_dict(self) -> dict[str, Any]:
        """Every setting by its settings-file key (the long flag names with underscores; the two settings
        objects' fields under their flags' names), as ``config.json`` and ``--dump-config`` write them."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "connection":
                out.update(connection_keys(value))
            elif f.name == "verification":
                out.update(verification_keys(value))
            else:
                out[f.name] = copy.deepcopy(value)
        return out

    @property
    def objectives(self) -> Objective:
        """The run's objectives (without the baseline's metric, which the run adds)."""
        return Objective.from_config(self.to_dict())

    @property
    def directions(self) -> tuple[str, ...]:
        return self.objectives.directions

    @property
    def counters(self) -> tuple[str, ...]:
        """The hardware counters every replay collects: ``--metrics``, then those ``--objective`` ranks by."""
        names = parse_metric_names(self.metrics)
        return names + tuple(n for n in counter_names(self.objective) if n not in names)

    @property
    def measurement(self) -> MeasurementSettings:
        """What the replays measure besides times: an energy window when an objective needs one."""
        return MeasurementSettings(energy=needs_energy(self.objective), energy_window_s=self.energy_window)

    def proteus_path(self, results_dir: Path) -> Path | None:
        if self.proteus_output is False:
            return None
        if self.proteus_output in (None, True):
            return results_dir / PROTEUS_FILE
        return Path(str(self.proteus_output))


#: The settings-file keys ``connection`` holds, and its fields they fill.
CONNECTION_KEYS = {"servers": "servers", "token_file": "token_file", "tls_ca": "tls_ca",
                   "tls_server_name": "tls_server_name", "keep_servers": "keep_alive", "server_engine": "engine",
                   "lock_clocks": "lock_clocks"}
#: The settings-file keys ``verification`` holds.
VERIFICATION_KEYS = ("tolerance", "tolerance_policies", "tolerance_runs", "no_relocate")


def connection_keys(connection: ConnectionSettings) -> dict[str, Any]:
    """``connection``'s settings-file keys (``CONNECTION_KEYS``) and values."""
    values = {key: getattr(connection, name) for key, name in CONNECTION_KEYS.items()}
    values["servers"] = None if connection.servers is None else list(connection.servers)
    return values


def verification_keys(verification: VerificationSettings) -> dict[str, Any]:
    """``verification``'s settings-file keys (``VERIFICATION_KEYS``) and values."""
    return {"tolerance": verification.mode, "tolerance_policies": dict(verification.overrides),
            "tolerance_runs": verification.runs, "no_relocate": verification.relocate is False}


def connection_from_flags(flags: Mapping[str, Any]) -> ConnectionSettings:
    """How ``mneme tune`` reaches its replay servers, from its resolved flags (``CONNECTION_KEYS``; missing
    ones take their defaults).

    Args:
        flags: settings by their settings-file keys (``servers``, ``token_file``, ``tls_ca``,
            ``tls_server_name``, ``keep_servers``, ``server_engine``).

    Returns:
        The connection settings.
    """
    return ConnectionSettings(**{name: flags[key] for key, name in CONNECTION_KEYS.items()
                                 if flags.get(key) is not None})


FIELDS = {f.name: f for f in dataclasses.fields(TuneOptions)}
#: Every settings-file key (a flag's long name with underscores), in ``to_dict``'s order.
KEYS = tuple(TuneOptions().to_dict())
_BOOL_KEYS = {name for name, f in FIELDS.items() if f.type == "bool"} | {"no_relocate"}
# What config.json adds beside the settings; ignored when it is read back with --config.
RUN_METADATA = ("kernel", "device", "mneme_version", "written", "fingerprint")


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a ``--config`` file (YAML; JSON is YAML too) into a dict of known keys.

    Args:
        path: the file.

    Returns:
        The settings, by option name.

    Raises:
        ConfigurationError: the file cannot be read, is not YAML, or holds unknown keys.
    """
    import yaml

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigurationError(f"cannot read --config {p}: {exc.strerror}; check the path") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"--config {p} is not valid YAML: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigurationError(f"--config {p} must hold a mapping of settings, e.g. 'sampler: tpe'")
    data = {str(k).replace("-", "_"): v for k, v in data.items() if k not in RUN_METADATA}
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigurationError(
            f"--config {p}: unknown settings {unknown}; valid keys are the long flag names with "
            f"underscores: {', '.join(sorted(KEYS))}"
        )
    return data


def resolve_options(cli: Mapping[str, Any], config_file: str | Path | None = None,
                    base: Mapping[str, Any] | None = None) -> TuneOptions:
    """Defaults, then ``base`` (the settings of the run ``--resume`` continues), then the config file, then
    the command line; normalized and validated.

    Args:
        cli: the command line's settings, by option name.
        config_file: the ``--config`` file (None: none).
        base: the settings of the run ``--resume`` continues (None: none).

    Returns:
        The ``TuneOptions``.

    Raises:
        ConfigurationError: an unknown key, a value of the wrong type, or settings that conflict.
    """
    merged: dict[str, Any] = _tolerance_layer(base, {}) if base else {}
    if config_file:
        merged = _tolerance_layer(load_config_file(config_file), merged)
    merged = _tolerance_layer({k: v for k, v in cli.items() if k in KEYS or k == "tolerance_file"}, merged)
    flags = {k: _normalize(k, v) for k, v in merged.items()}
    options = TuneOptions(**_settings_objects(flags))
    validate(options, explicit=set(merged))
    return options


def _settings_objects(flags: dict[str, Any]) -> dict[str, Any]:
    """``flags`` with the keys of the two settings objects replaced by the objects, checked with messages
    that name the flags."""
    verification = {k: flags.pop(k) for k in VERIFICATION_KEYS if k in flags}
    connection = {k: flags.pop(k) for k in CONNECTION_KEYS if k in flags}
    runs = verification.get("tolerance_runs")
    if runs is not None and runs < 2:
        raise ConfigurationError(f"--tolerance-runs must be at least 2, got {runs}")
    mode = verification.get("tolerance")
    if mode is not None and mode not in TOLERANCE_MODES:
        raise ConfigurationError(f"--tolerance {mode!r}: use auto (default), exact, or SEL=dtype:mode:threshold")
    policies = verification.get("tolerance_policies") or {}
    ToleranceOverrides.from_mapping(policies, "--tolerance policies")
    flags["verification"] = verification_from_flags(
        [mode] if mode else [], (), runs or DEFAULT_RUNS, bool(verification.get("no_relocate")),
        default_mode="auto", policies=policies)
    _check_keep_servers(connection.get("keep_servers"), connection.get("servers") or flags.get("servers_from"))
    _check_lock_clocks(connection.get("lock_clocks"), connection.get("keep_servers"),
                       connection.get("servers") or flags.get("servers_from"))
    flags["connection"] = connection_from_flags(connection)
    return flags


def _tolerance_layer(layer: Mapping[str, Any], below: dict[str, Any]) -> dict[str, Any]:
    """``below`` updated with one settings layer, whose ``tolerance`` is what ``mneme replay --tolerance``
    takes (a mode, ``SEL=SPEC`` policies, or a list of them) and ``tolerance_file`` names JSON files of
    policies: the mode becomes ``tolerance``, the policies join ``tolerance_policies`` (this layer's
    winning per selector)."""
    out = {**below, **{k: v for k, v in layer.items() if k not in ("tolerance", "tolerance_file")}}
    policies = dict(_policies(below.get("tolerance_policies")))
    policies.update(_policies(layer.get("tolerance_policies")))
    values, files = layer.get("tolerance"), layer.get("tolerance_file") or []
    if values is not None or files:
        mode, given = tolerance_flags([values] if isinstance(values, str) else list(values or []),
                                      [files] if isinstance(files, (str, Path)) else list(files))
        if mode is not None:
            out["tolerance"] = mode
        policies.update(given)
    if policies:
        out["tolerance_policies"] = policies
    return out


def _policies(value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"tolerance_policies must map region selectors to policies, e.g. {{acc: 'f32:ulp:16'}}, got {value!r}"
        )
    return value


_RANGE_RE = re.compile(r"^\s*(-?\d+)\s*(?:\.\.|:|-|,)\s*(-?\d+)\s*$")


def parse_int_range(value: Any, flag: str) -> list[int]:
    """``[LOW, HIGH]`` from a pair, an int, or a string ``LOW..HIGH`` (also ``:`` ``-`` ``,``)."""
    if isinstance(value, bool):
        raise ConfigurationError(f"{flag}: expected LOW HIGH, got {value!r}")
    if isinstance(value, int):
        return [value, value]
    if isinstance(value, str):
        m = _RANGE_RE.match(value)
        if m:
            value = [int(m.group(1)), int(m.group(2))]
        elif value.strip().lstrip("-").isdigit():
            return [int(value), int(value)]
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        low, high = value
        if low > high:
            raise ConfigurationError(f"{flag} {low} {high}: LOW is above HIGH")
        return [low, high]
    raise ConfigurationError(f"{flag}: expected two integers LOW HIGH (or 'LOW..HIGH'), got {value!r}")


def parse_space_args(items: Any) -> dict[str, Any]:
    """``--space-arg KEY=VALUE`` items (or a YAML mapping) as a dict; values JSON-decoded when they parse."""
    if items is None:
        return {}
    if isinstance(items, Mapping):
        return dict(items)
    out: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, str) or "=" not in item:
            raise ConfigurationError(f"--space-arg {item!r}: expected KEY=VALUE, e.g. --space-arg tile=32")
        key, raw = item.split("=", 1)
        if not key.isidentifier():
            raise ConfigurationError(f"--space-arg {item!r}: {key!r} is not a valid argument name")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def _normalize(key: str, value: Any) -> Any:
    if value is None:
        return None
    if key in ("codegen_opt_range", "max_threads_range", "min_blocks_per_sm_range"):
        return parse_int_range(value, "--" + key.replace("_", "-"))
    if key == "space_args":
        return parse_space_args(value)
    if key == "passes":
        if isinstance(value, str):
            return [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigurationError(f"passes must be a list of pipelines, got {value!r}")
        return list(value)
    if key == "servers":
        if isinstance(value, str):
            value = [s for s in value.split(",") if s]
        return [str(s) for s in value]
    if key in ("record_id", "record_database", "space_module", "results_dir", "pipeline_file",
               "fixed_passes", "study_name", "optuna_storage", "dump_config", "servers_from", "token_file",
               "tls_ca", "tls_server_name", "server_engine", "lock_clocks"):
        return str(value)
    if key == "metrics":  # "dram_bytes,l2_hit_rate", or a list of such texts
        return list(parse_metric_names([value] if isinstance(value, str) else value))
    if key == "objective":  # "time,energy", or a YAML list of them
        return ",".join(objective_names(",".join(value) if isinstance(value, (list, tuple)) else str(value)))
    if key in ("trials", "seed", "warmup", "iterations", "workers", "fixed_codegen_opt",
               "fixed_min_blocks_per_sm", "tolerance_runs"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigurationError(f"{key} must be an integer, got {value!r}")
        try:
            return int(value)
        except ValueError:
            raise ConfigurationError(f"{key} must be an integer, got {value!r}") from None
    if key == "keep_servers":
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigurationError(f"keep_servers must be a number of seconds, got {value!r}") from None
    if key in ("timeout", "energy_window"):
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigurationError(f"{key} must be a number of seconds, got {value!r}") from None
    if key in _BOOL_KEYS and not isinstance(value, bool):
        raise ConfigurationError(f"{key} must be true or false, got {value!r}")
    return value


def _choice(value: Any, choices: tuple[str, ...], flag: str) -> None:
    if value is not None and value not in choices:
        raise ConfigurationError(f"{flag} {value!r}: choose one of {', '.join(choices)}")


def validate(o: TuneOptions, explicit: set[str] = frozenset()) -> None:
    """Refuse contradictory or out-of-range settings with a message that says what to change."""
    _choice(o.sampler, SAMPLERS, "--sampler")
    _choice(o.metric, METRICS, "--metric")
    for error in objective_errors(o.objective):
        raise ConfigurationError(error)
    _choice(o.secondary_objective, SECONDARY_OBJECTIVES, "--secondary-objective")
    _choice(o.pruner, PRUNERS, "--pruner")
    _choice(o.space_preset, PRESETS, "--space-preset")
    _choice(o.launch_dim, LAUNCH_DIMS, "--launch-dim")
    _choice(o.launch_safety, LAUNCH_SAFETIES, "--launch-safety")
    _choice(o.max_threads_policy, MAX_THREADS_POLICIES, "--max-threads-policy")
    for key in ("specialize_space", "specialize_dims_space", "launch_bounds_space"):
        _choice(getattr(o, key), BOOL_MODES, "--" + key.replace("_", "-"))
    if o.sampler in BUDGETED_SAMPLERS and o.trials is None:
        raise ConfigurationError(f"--sampler {o.sampler} needs --trials N (how many configurations to evaluate)")
    if o.sampler not in BUDGETED_SAMPLERS and o.trials is not None:
        raise ConfigurationError(
            f"--sampler {o.sampler} enumerates the whole space and takes no --trials; "
            "drop --trials, or use --sampler random or tpe"
        )
    if o.secondary_objective != FIELDS["secondary_objective"].default and o.sampler != "nsga2":
        raise ConfigurationError("--secondary-objective is for the multi-objective --sampler nsga2")
    _check_objectives(o, explicit)
    for key, low in (("trials", 1), ("iterations", 1), ("warmup", 0), ("workers", 1)):
        value = getattr(o, key)
        if value is not None and value < low:
            raise ConfigurationError(f"--{key.replace('_', '-')} must be at least {low}, got {value}")
    if o.timeout is not None and o.timeout <= 0:
        raise ConfigurationError(f"--timeout must be a positive number of seconds, got {o.timeout}")
    exclusive = (("passes", "fixed_passes", "pipeline_file"), ("codegen_opt_range", "fixed_codegen_opt"),
                 ("min_blocks_per_sm_range", "fixed_min_blocks_per_sm"))
    for group in exclusive:
        given = [k for k in group if getattr(o, k) is not None]
        if len(given) > 1:
            flags = " and ".join("--" + k.replace("_", "-") for k in given)
            raise ConfigurationError(f"{flags} contradict each other; give one of them")
    if o.space_module:
        builtin_given = [k for k in BUILTIN_KEYS
                         if k in explicit and getattr(o, k) not in (None, FIELDS[k].default)]
        if builtin_given:
            flags = ", ".join("--" + k.replace("_", "-") for k in builtin_given)
            raise ConfigurationError(
                f"{flags} configure the built-in space, which --space-module replaces; drop one or the other"
            )
    elif o.space_args:
        raise ConfigurationError("--space-arg passes arguments to a --space-module class; give --space-module too")
    if o.resume and not o.results_dir:
        raise ConfigurationError("--resume continues an earlier run: give its --results-dir DIR")
    if o.verification.mode not in TOLERANCE_MODES:
        raise ConfigurationError(f"--tolerance {o.verification.mode!r}: use auto (default), exact, "
                                 "or SEL=dtype:mode:threshold")
    ToleranceOverrides.from_mapping(o.verification.overrides, "--tolerance policies")
    if o.connection.servers and o.servers_from:
        raise ConfigurationError("--servers and --servers-from both name the replay servers; give one of them")
    _check_keep_servers(o.connection.keep_alive, o.connection.servers or o.servers_from)
    _check_lock_clocks(o.connection.lock_clocks, o.connection.keep_alive, o.connection.servers or o.servers_from)
    if o.rerun_baseline and not o.resume:
        raise ConfigurationError("--rerun-baseline only makes sense with --resume")
    if o.optuna_storage and o.sampler in ("exhaustive",):
        raise ConfigurationError("--optuna-storage needs an Optuna sampler (random, tpe, grid, nsga2)")
    if not o.dump_config:
        if not o.record_database:
            raise ConfigurationError(
                "--record-database is required (the recording database JSON; `mneme ls` lists them); "
                "--record-id may be left out when the database holds one instance"
            )


def _check_objectives(o: TuneOptions, explicit: set[str]) -> None:
    """``--objective`` against the sampler, ``--secondary-objective``, the pruner and ``--energy-window``."""
    names = objective_names(o.objective)
    if len(names) > 1:
        if o.sampler != "nsga2":
            raise ConfigurationError(f"--objective {o.objective} is a multi-objective search: use --sampler nsga2 "
                                     "(its best.json holds the Pareto front)")
        if "secondary_objective" in explicit:
            raise ConfigurationError(f"--secondary-objective adds a second objective to one --objective; "
                                     f"--objective {o.objective} names its objectives already: drop one of them")
    if names and (names[0] in ENERGY_OBJECTIVES or is_counter(names[0])) and o.pruner != "none":
        raise ConfigurationError(f"--pruner prunes on the time after each launch; --objective {names[0]} is measured "
                                 "once per configuration, after its launches: drop --pruner")
    try:
        MeasurementSettings(energy=needs_energy(o.objective), energy_window_s=o.energy_window)
    except ConfigurationError as exc:
        raise ConfigurationError(f"--energy-window: {exc}") from None


def _check_lock_clocks(lock_clocks: str | None, keep_servers: float | None, remote: Any) -> None:
    """``--lock-clocks`` against ``--keep-servers`` and the servers named (``--servers``, ``--servers-from``)."""
    if lock_clocks in (None, "off"):
        return
    if lock_clocks not in LOCK_CLOCKS:
        raise ConfigurationError(f"--lock-clocks {lock_clocks!r}: choose one of {', '.join(LOCK_CLOCKS)}")
    if remote:
        raise ConfigurationError("--lock-clocks locks the clocks of the local replay servers a run starts; with "
                                 "--servers or --servers-from it starts none: start those servers with `mneme "
                                 "serve --lock-clocks` instead")
    if keep_servers:
        raise ConfigurationError("--lock-clocks and --keep-servers: servers kept for later runs would serve those at "
                                 "the locked clocks too; drop one of them")


def _check_keep_servers(keep_servers: float | None, remote: Any) -> None:
    """``--keep-servers`` (seconds, or None) against the servers named (``--servers``, ``--servers-from``)."""
    from replay_server.kept_servers import MIN_KEEP_ALIVE_S

    if keep_servers and keep_servers < MIN_KEEP_ALIVE_S:
        raise ConfigurationError(f"--keep-servers {keep_servers:g}: give at least {MIN_KEEP_ALIVE_S:g} seconds "
                                 "(how long the servers left running wait for the next run)")
    if keep_servers and remote:
        raise ConfigurationError("--keep-servers keeps the local servers a run starts; with --servers or "
                                 "--servers-from it starts none: drop one of them")
