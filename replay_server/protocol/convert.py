"""Mapping between the model (mneme.model: configurations, results, verification settings) and its wire form.

Kept beside the stubs so the client (replay_server.client.executor) and the servers
(replay_server) agree on one translation, field for field.
"""

from __future__ import annotations

import json
import operator
from typing import Any

from google.protobuf import json_format, struct_pb2

from mneme.errors import ConfigurationError
from mneme.model.experiment import Dim3, ExperimentConfiguration, ExperimentResult
from mneme.model.measurement import DEFAULT_ENERGY_WINDOW_S, MeasurementSettings
from mneme.model.verification import DEFAULT_RUNS, DEFAULT_SAFETY, VerificationSettings
from replay_server.protocol import replay_pb2

#: The most a client may ask a server to hold ready responses (``ReplayBatch.hold_responses_seconds``).
MAX_HOLD_RESPONSES_SECONDS = 1.0


def verification_to_proto(settings: VerificationSettings) -> replay_pb2.Verification:
    """The ``Verification`` message of ``settings`` (every field; policies as JSON objects).

    Args:
        settings: how the replays of an instance verify.

    Returns:
        The message an ``InstanceRef`` carries as its ``verification``.
    """
    msg = replay_pb2.Verification(mode=settings.mode, runs=settings.runs, safety=settings.safety,
                                  overrides=json.dumps(settings.overrides) if settings.overrides else "",
                                  derived=json.dumps(settings.derived) if settings.derived else "",
                                  every_iteration=settings.every_iteration)
    if settings.relocate is not None:
        msg.relocate = settings.relocate
    return msg


def verification_from_proto(msg: replay_pb2.Verification) -> VerificationSettings:
    """The settings a ``Verification`` message carries, checked (every policy parses); a zero ``runs`` or
    ``safety`` and an empty ``mode`` are the defaults.

    Args:
        msg: ``InstanceRef.verification``.

    Returns:
        The verification settings.

    Raises:
        ConfigurationError: an unknown mode, too few runs, a policy that does not parse, or policies
            that are not a JSON object.
    """
    from mneme.replay.tolerance import judged_overrides

    settings = VerificationSettings(
        mode=msg.mode or "exact", runs=msg.runs or DEFAULT_RUNS, safety=msg.safety or DEFAULT_SAFETY,
        overrides=_policies(msg.overrides, "tolerance overrides"), derived=_policies(msg.derived, "derived tolerance"),
        relocate=msg.relocate if msg.HasField("relocate") else None, every_iteration=msg.every_iteration)
    judged_overrides(settings)  # every policy parses
    return settings


def measurement_to_proto(settings: MeasurementSettings) -> replay_pb2.Measurement:
    """The ``Measurement`` message of ``settings`` (every field).

    Args:
        settings: what the replays of an instance measure besides their times.

    Returns:
        The message an ``InstanceRef`` carries as its ``measurement``.
    """
    return replay_pb2.Measurement(energy=settings.energy, energy_window_seconds=settings.energy_window_s,
                                  conditions_max_age_seconds=settings.conditions_max_age_s)


def measurement_from_proto(msg: replay_pb2.Measurement) -> MeasurementSettings:
    """The settings a ``Measurement`` message carries, checked; a zero window and an unset age are the defaults.

    Args:
        msg: ``InstanceRef.measurement``.

    Returns:
        The measurement settings.

    Raises:
        ConfigurationError: a window or age out of range.
    """
    fields: dict[str, Any] = {"energy": msg.energy, "energy_window_s": msg.energy_window_seconds or DEFAULT_ENERGY_WINDOW_S}
    if msg.HasField("conditions_max_age_seconds"):
        fields["conditions_max_age_s"] = msg.conditions_max_age_seconds
    return MeasurementSettings(**fields)


_READING_FIELDS = ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w")
_WINDOW_FIELDS = (("window_s", "window_seconds"), ("launches", "launches"), ("counter_steps", "counter_steps"),
                  ("batches", "batches"), ("launches_run", "launches_run"))


def conditions_to_proto(conditions: dict[str, Any]) -> replay_pb2.Conditions:
    """The ``Conditions`` message of a result's ``conditions`` (typed fields: a result costs a few microseconds
    each way, where a Struct would cost tens).

    Args:
        conditions: ``ExperimentResult.conditions``.

    Returns:
        The message.
    """
    msg = replay_pb2.Conditions(throttled=bool(conditions.get("throttled")),
                                throttle_reasons=conditions.get("throttle_reasons") or (),
                                unavailable=conditions.get("unavailable") or "")
    for name in ("before", "after"):
        reading = conditions.get(name)
        if reading is not None:
            target = getattr(msg, name)
            for key in _READING_FIELDS:
                value = reading.get(key)
                if value is not None:
                    setattr(target, key, value)
            target.clock_event_reasons.extend(reading.get("clock_event_reasons") or ())
            if reading.get("age_s") is not None:
                target.age_seconds = reading["age_s"]
            target.SetInParent()
    energy = conditions.get("energy")
    if energy is not None:
        msg.energy.error = energy.get("error") or ""
        for key, wire in _WINDOW_FIELDS:
            if energy.get(key) is not None:
                setattr(msg.energy, wire, energy[key])
        msg.energy.SetInParent()
    return msg


def conditions_from_proto(msg: replay_pb2.Conditions) -> dict[str, Any]:
    """A result's ``conditions`` from its message (the inverse of :func:`conditions_to_proto`).

    Args:
        msg: ``Result.conditions``.

    Returns:
        The dict.
    """
    out: dict[str, Any] = {}
    for field, value in msg.ListFields():  # (only the fields that are set: a few microseconds per result)
        name = field.name
        if name in ("before", "after"):
            reading = {"clock_event_reasons": []}
            for f, v in value.ListFields():
                reading[_READING_KEYS.get(f.name, f.name)] = list(v) if f.name == "clock_event_reasons" else v
            out[name] = reading
        elif name == "energy":
            out["energy"] = {"error": value.error} if value.error else {key: getattr(value, wire)
                                                                        for key, wire in _WINDOW_FIELDS}
        elif name == "unavailable":
            out["unavailable"] = value
    if "before" in out or msg.throttled or msg.throttle_reasons:
        out["throttled"] = msg.throttled
        out["throttle_reasons"] = list(msg.throttle_reasons)
    return out


_READING_KEYS = {"age_seconds": "age_s"}


def _policies(text: str, what: str) -> Any:
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except ValueError:
        raise ConfigurationError(f"{what} {text[:80]!r}: expected a JSON object of policies by region") from None


def config_fields(config: ExperimentConfiguration) -> dict[str, Any]:
    """The ``Configuration`` message's fields as keyword arguments: a message built from them in one call
    (or a request given them as its ``config``) costs a third less than one filled field by field.
    An unset launch bound (None) leaves the optional field unset."""
    g, b = config.grid, config.block
    return {
        "grid": {"x": g.x, "y": g.y, "z": g.z},
        "block": {"x": b.x, "y": b.y, "z": b.z},
        "shared_mem": config.shared_mem,
        "specialize": config.specialize,
        "set_launch_bounds": config.set_launch_bounds,
        "max_threads": config.max_threads,
        "min_blocks_per_sm": config.min_blocks_per_sm,
        "specialize_dims": config.specialize_dims,
        "passes": config.passes,
        "codegen_opt": config.codegen_opt,
        "codegen_method": config.codegen_method,
        "prune": config.prune,
        "internalize": config.internalize,
    }


def config_to_proto(config: ExperimentConfiguration) -> replay_pb2.Configuration:
    return replay_pb2.Configuration(**config_fields(config))


def config_from_proto(msg: replay_pb2.Configuration) -> ExperimentConfiguration:
    """The configuration a request carries. The message's fields are typed already (unsigned extents,
    integers, booleans, strings), so the configuration is made from them directly: what
    ``ExperimentConfiguration.from_dict`` would make of their dict, at a fifth of the cost (a server
    reads one per request)."""
    g, b = msg.grid, msg.block
    return ExperimentConfiguration(
        grid=Dim3(g.x, g.y, g.z),
        block=Dim3(b.x, b.y, b.z),
        shared_mem=msg.shared_mem,
        specialize=msg.specialize,
        set_launch_bounds=msg.set_launch_bounds,
        max_threads=msg.max_threads if msg.HasField("max_threads") else None,
        min_blocks_per_sm=msg.min_blocks_per_sm if msg.HasField("min_blocks_per_sm") else None,
        specialize_dims=msg.specialize_dims,
        passes=msg.passes,
        codegen_opt=msg.codegen_opt,
        codegen_method=msg.codegen_method,
        prune=msg.prune,
        internalize=msg.internalize,
    )


_SCALAR_RESULT_FIELDS = (
    "preprocess_ir_time", "opt_time", "codegen_time", "obj_size", "verified", "executed", "failed",
    "start_time", "end_time", "gpu_id", "const_mem_usage", "local_mem_usage", "reg_usage", "error",
    "status", "warmup", "shared_mem_usage", "compile_cached", "relocated", "relocation_reason",
    "reset_each_launch", "reset_reason", "metrics_error",
)


def result_to_proto(result: ExperimentResult) -> replay_pb2.Result:
    msg = replay_pb2.Result(**{name: getattr(result, name) for name in _SCALAR_RESULT_FIELDS})
    msg.exec_time.extend(int(t) for t in result.exec_time)
    for mismatch in result.mismatches:
        s = struct_pb2.Struct()
        s.update(mismatch)
        msg.mismatches.append(s)
    if result.verified_within:
        msg.verified_within.update(result.verified_within)
    for finding in result.nondeterminism:
        s = struct_pb2.Struct()
        s.update(finding)
        msg.nondeterminism.append(s)
    if result.energy_j >= 0:  # (unset: not measured, also from a server that predates the fields)
        msg.energy_j = result.energy_j
    if result.power_w >= 0:
        msg.power_w = result.power_w
    if result.conditions:
        msg.conditions.CopyFrom(conditions_to_proto(result.conditions))
    if result.metrics:
        msg.metrics.update(result.metrics)
    return msg


_scalar_result_values = operator.attrgetter(*_SCALAR_RESULT_FIELDS)  # one C call for them all (per result)


def result_from_proto(msg: replay_pb2.Result) -> ExperimentResult:
    fields = dict(zip(_SCALAR_RESULT_FIELDS, _scalar_result_values(msg)))
    return ExperimentResult(exec_time=list(msg.exec_time),
                            mismatches=[json_format.MessageToDict(m) for m in msg.mismatches],
                            # (MessageToDict is slow even for the empty Struct most results carry)
                            verified_within=_whole(json_format.MessageToDict(msg.verified_within))
                            if msg.verified_within.fields else {},
                            nondeterminism=[_whole(json_format.MessageToDict(m)) for m in msg.nondeterminism],
                            conditions=conditions_from_proto(msg.conditions) if msg.HasField("conditions") else {},
                            energy_j=msg.energy_j if msg.HasField("energy_j") else -1.0,
                            power_w=msg.power_w if msg.HasField("power_w") else -1.0,
                            metrics=dict(msg.metrics) if msg.metrics else {}, **fields)


def _whole(value: Any) -> Any:
    """A Struct's numbers are doubles: give back the counts (runs, elements, ULPs) as the ints they were."""
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value
