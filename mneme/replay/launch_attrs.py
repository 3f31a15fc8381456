"""The recorded launch attributes a replay launches with, or refuses with a reason.

An application that launches through ``cudaLaunchKernelExC``/``cuLaunchKernelEx``
(or ``cudaLaunchCooperativeKernel``) gives the launch attributes: thread-block
cluster dimensions, cooperative (grid-wide synchronization), scheduling hints.
A kernel written for them does not run correctly without them (distributed
shared memory needs its cluster; ``grid.sync()`` needs a cooperative launch),
so the replay makes the same launch, through ``cuLaunchKernelEx``. Attributes
that name things of the application's process (events, an L2 persisting
window whose set-aside the recording does not hold) or that apply to streams or
graphs only cannot be reproduced: the recorder's agent writes such a launch
``supported: false`` with ``unreplayable_reasons`` (record_agent/support.py),
and the replay refuses it, naming the attribute (recordings made before the
agent did so are refused here, by ``plan_for``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Iterable

from mneme.errors import NotAvailableError

#: sizeof(CUlaunchAttributeValue) in CUDA 12 and 13.
VALUE_BYTES = 64

#: CUlaunchAttributeID -> (name, struct layout of the value) of the attributes a replay reproduces.
REPLAYED: dict[int, tuple[str, str]] = {
    2: ("cooperative", "<i"),
    4: ("cluster_dim", "<3I"),
    5: ("cluster_scheduling_policy_preference", "<i"),
    6: ("programmatic_stream_serialization", "<i"),
    8: ("priority", "<i"),
    9: ("mem_sync_domain_map", "<2B"),
    10: ("mem_sync_domain", "<i"),
    11: ("preferred_cluster_dim", "<3I"),
    14: ("preferred_shared_memory_carveout", "<I"),
    16: ("nvlink_util_centric_scheduling", "<I"),
}

#: CUlaunchAttributeID -> (name, why a replay cannot reproduce it).
REFUSED: dict[int, tuple[str, str]] = {
    1: ("access_policy_window", "it points an L2 persisting window at application memory, and the recording "
        "holds neither the persisting-L2 set-aside nor the window's stream state"),
    3: ("synchronization_policy", "it applies to streams, not launches"),
    7: ("programmatic_event", "it names a CUDA event of the application's process"),
    12: ("launch_completion_event", "it names a CUDA event of the application's process"),
    13: ("device_updatable_kernel_node", "it applies to CUDA graph nodes only"),
}


@dataclass(frozen=True)
class LaunchPlan:
    """What the engine needs to repeat the recorded launch's attributes."""

    attributes: tuple[tuple[int, bytes], ...] = ()  # (CUlaunchAttributeID, value bytes) for cuLaunchKernelEx
    names: tuple[str, ...] = ()
    cluster_dim: tuple[int, int, int] | None = None
    cooperative: bool = False

    def launch_errors(self, grid: tuple[int, int, int]) -> list[str]:
        """Why a grid cannot be launched with these attributes (empty: it can, as far as we can tell)."""
        if self.cluster_dim is None:
            return []
        return [
            f"grid {axis}={g} is not a multiple of the recorded cluster dimension {axis}={c} "
            "(the kernel was launched in thread-block clusters; keep the grid a multiple of the cluster)"
            for axis, g, c in zip("xyz", grid, self.cluster_dim)
            if c and g % c
        ]


def _value_bytes(attr: Any, layout: str, name: str) -> bytes:
    if attr.raw:
        value = bytes(attr.raw[:VALUE_BYTES])
    else:
        try:
            value = struct.pack(layout, *attr.value)
        except struct.error:
            raise NotAvailableError(
                f"the recorded launch attribute {name} (id {attr.id}) has the value {list(attr.value)}, which does "
                f"not fit its layout; the recording is damaged"
            ) from None
    return value.ljust(VALUE_BYTES, b"\0")


def attribute_problem(attr: Any) -> str | None:
    """Why a replay cannot repeat the recorded launch attribute ``attr`` (None: it can, or it is ignored)."""
    if attr.id == 0:  # CU_LAUNCH_ATTRIBUTE_IGNORE
        return None
    if attr.id in REFUSED:
        name, why = REFUSED[attr.id]
        return f"the recorded launch has the launch attribute {name} (id {attr.id}), which a replay cannot reproduce: {why}"
    if attr.id not in REPLAYED:
        label = f"{attr.name} " if attr.name and attr.name != "raw" else ""
        return (
            f"the recorded launch has the launch attribute {label}(id {attr.id}), which this mneme does not know "
            "how to replay; upgrade mneme, or record the kernel launched without it"
        )
    name, layout = REPLAYED[attr.id]
    try:
        _value_bytes(attr, layout, name)
    except NotAvailableError as exc:
        return str(exc)
    return None


def unreplayable_reasons(recorded: Iterable[Any]) -> tuple[str, ...]:
    """Why a replay cannot repeat the recorded launch attributes (empty: it can repeat all of them)."""
    return tuple(p for p in map(attribute_problem, recorded) if p is not None)


def plan_for(recorded: Iterable[Any]) -> LaunchPlan:
    """The engine's attributes for recorded ``LaunchAttribute``s; NotAvailableError naming one it cannot replay."""
    recorded = tuple(recorded)
    problems = unreplayable_reasons(recorded)
    if problems:
        raise NotAvailableError(problems[0])
    attributes, names = [], []
    cluster, cooperative = None, False
    for attr in recorded:
        if attr.id == 0:
            continue
        name, layout = REPLAYED[attr.id]
        value = _value_bytes(attr, layout, name)
        decoded = struct.unpack_from(layout, value)
        if name == "cluster_dim" and any(decoded):
            cluster = (int(decoded[0]), int(decoded[1]), int(decoded[2]))
        if name == "cooperative":
            cooperative = bool(decoded[0])
        attributes.append((attr.id, value))
        names.append(name)
    return LaunchPlan(tuple(attributes), tuple(names), cluster, cooperative)
