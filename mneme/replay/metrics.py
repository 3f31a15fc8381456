"""Hardware counters of a replayed launch: which metrics, their raw CUPTI names, and why they cannot be had.

The policy over the engine's profiler (``mneme._engine.MetricConfig``, ``profile``; CUPTI's range
profiler): a small curated list of useful metrics by name (:data:`CURATED`: DRAM bytes, achieved
occupancy, SM throughput, L2 hit rate, warp stall reasons...), each mapped to the raw metric of
the device's generation (the first of its candidates the chip has), plus any raw metric name the
device supports, validated by CUPTI's host side (an unknown name is an error listing close names).
Counters are collected after a configuration's timed launches, never during them: one launch per
profiler pass, the memory reset from the recorded prologue and the L2 flushed before each pass,
as Nsight Compute's kernel replay does. A host where the profiler cannot run (the driver restricts
counters to administrators, a virtualized or MIG GPU, counters held by another profiler) gives a
one-line error naming the cause and the fix (:func:`explain`).

Importing this module touches no CUDA: the tuner and the servers' request checks parse names with it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mneme.errors import ConfigurationError, NotAvailableError


@dataclass(frozen=True)
class Metric:
    """A curated metric.

    Attributes:
        name: the name ``--metrics`` takes (``dram_bytes``).
        raw: the raw CUPTI metrics it stands for, by generation: the first one the chip has is used.
        unit: the unit of its value.
        better: ``lower`` or ``higher`` when one direction is better (``mneme tune --objective``
            may minimize or maximize it), else ''.
        description: what it counts.
    """

    name: str
    raw: tuple[str, ...]
    unit: str
    better: str
    description: str


#: Warp stall reasons (``smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio``: warps
#: waiting for that reason per issue cycle, Nsight Compute's warp state statistics).
STALL_REASONS = (
    "long_scoreboard", "short_scoreboard", "barrier", "membar", "math_pipe_throttle", "mio_throttle",
    "lg_throttle", "tex_throttle", "wait", "not_selected", "selected", "branch_resolving", "no_instruction",
    "dispatch_stall", "drain", "sleeping", "imc_miss", "misc",
)

_CURATED = (
    Metric("dram_bytes", ("dram__bytes.sum",), "bytes", "lower", "bytes read from and written to DRAM"),
    Metric("dram_read_bytes", ("dram__bytes_read.sum", "dram__bytes_op_read.sum"), "bytes", "lower",
           "bytes read from DRAM"),
    Metric("dram_write_bytes", ("dram__bytes_write.sum", "dram__bytes_op_write.sum"), "bytes", "lower",
           "bytes written to DRAM"),
    Metric("dram_throughput", ("dram__throughput.avg.pct_of_peak_sustained_elapsed",), "%", "",
           "DRAM throughput, percent of peak"),
    Metric("achieved_occupancy", ("sm__warps_active.avg.pct_of_peak_sustained_active",), "%", "higher",
           "warps active per cycle, percent of the SM's maximum (achieved occupancy)"),
    Metric("sm_throughput", ("sm__throughput.avg.pct_of_peak_sustained_elapsed",), "%", "",
           "SM throughput, percent of peak (the busiest SM unit)"),
    Metric("memory_throughput", ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",), "%", "",
           "memory throughput, percent of peak (the busiest memory unit)"),
    Metric("l2_hit_rate", ("lts__t_sector_hit_rate.pct",), "%", "higher", "L2 sector lookups that hit"),
    Metric("l1_hit_rate", ("l1tex__t_sector_hit_rate.pct",), "%", "higher", "L1/texture sector lookups that hit"),
    Metric("duration_ns", ("gpu__time_duration.sum",), "ns", "lower", "the launch's duration as the profiler saw it"),
    Metric("instructions", ("smsp__inst_executed.sum",), "warp instructions", "lower", "warp instructions executed"),
    Metric("ipc", ("sm__inst_executed.avg.per_cycle_active",), "warp instructions/cycle", "higher",
           "warp instructions executed per active cycle, per SM"),
    Metric("warp_latency", ("smsp__average_warp_latency_per_inst_issued.ratio",), "cycles", "lower",
           "cycles between two instructions of a warp (warp cycles per issued instruction)"),
) + tuple(
    Metric(f"stall_{reason}", (f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio",), "warps",
           "lower", f"warps stalled on {reason.replace('_', ' ')} per issue cycle")
    for reason in STALL_REASONS
)

#: The curated metrics by name.
CURATED: dict[str, Metric] = {m.name: m for m in _CURATED}
#: Names that stand for several curated metrics; a member the device lacks is left out.
GROUPS: dict[str, tuple[str, ...]] = {"warp_stalls": tuple(f"stall_{reason}" for reason in STALL_REASONS)}
#: CUPTI's profiler errors (CUptiResult) whose cause is the host, not the request.
CAUSES = {
    35: ("the NVIDIA driver lets only administrators read GPU performance counters "
         "(CUPTI_ERROR_INSUFFICIENT_PRIVILEGES): run as root, or allow every user with the nvidia module "
         "option NVreg_RestrictProfilingToAdminUsers=0 (a line 'options nvidia "
         "NVreg_RestrictProfilingToAdminUsers=0' in /etc/modprobe.d/, then reload the driver or reboot); "
         "a container also needs --cap-add SYS_ADMIN"),
    40: ("this virtual machine's GPU does not allow profiling (CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES): "
         "the hypervisor's administrator must enable profiling for its vGPU"),
    33: "profiling is not supported on this virtualized GPU (CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED)",
    43: "profiling is not supported on a MIG instance (CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED): replay on a whole GPU",
    41: "profiling is not supported with confidential computing on (CUPTI_ERROR_CONFIDENTIAL_COMPUTING_NOT_SUPPORTED)",
    42: "profiling is not supported on NVIDIA CMP devices (CUPTI_ERROR_CMP_DEVICE_NOT_SUPPORTED)",
    44: "profiling is not supported on SLI devices (CUPTI_ERROR_SLI_DEVICE_NOT_SUPPORTED)",
    45: "profiling is not supported under WSL on this driver (CUPTI_ERROR_WSL_DEVICE_NOT_SUPPORTED)",
    26: ("the GPU's performance counters are held by another profiler (CUPTI_ERROR_HARDWARE_BUSY): Nsight "
         "Compute, DCGM's profiling metrics (dcgm-exporter's DCP fields; `dcgmi profile --pause` pauses them) "
         "or another process collecting counters"),
    36: ("another profiling API is active in this process (CUPTI_ERROR_OLD_PROFILER_API_INITIALIZED): the range "
         "profiler cannot run beside CUPTI's legacy event and metric API"),
    27: "the range profiler does not support this GPU or driver (CUPTI_ERROR_NOT_SUPPORTED)",
}
#: cuptiProfilerDeviceSupported's fields, and what each says when it is not "supported".
_SUPPORT_FIELDS = {
    "architecture": "the GPU's architecture has no range profiler (compute capability 7.0 or newer has one)",
    "vgpu": "profiling is not enabled for this vGPU",
    "confidential_compute": "confidential computing is on",
    "cmp": "the device is an NVIDIA CMP",
    "sli": "SLI is enabled",
    "wsl": "WSL does not support profiling on this driver",
}
_SUPPORTED = 3
INVALID_METRIC_NAME = 17
METRIC_TYPES = (0, 1, 2)  # CUpti_MetricType: counter, ratio, throughput


def parse_metric_names(values: str | Iterable[str] | None) -> tuple[str, ...]:
    """The metric names of ``--metrics NAME,...`` (repeatable): curated names, group names and raw CUPTI
    names, in order, without duplicates; a name that is none of them is an error listing close curated names.

    Args:
        values: a comma-separated text, or texts (each comma-separated); None: none.

    Returns:
        The names (groups kept as given: :func:`expand` opens them).

    Raises:
        ConfigurationError: a name that is neither curated, a group, nor a raw metric name.
    """
    if values is None:
        return ()
    texts = [values] if isinstance(values, str) else list(values)
    out: list[str] = []
    for text in texts:
        if not isinstance(text, str):
            raise ConfigurationError(f"--metrics: expected metric names, got {text!r}")
        for name in (part.strip() for part in text.split(",")):
            if not name or name in out:
                continue
            if name not in CURATED and name not in GROUPS and not is_raw(name):
                raise ConfigurationError(f"--metrics {name}: not a metric mneme knows{_close(name, _known())}; "
                                         "use a curated name (mneme replay --list-metrics) or a raw CUPTI metric "
                                         "name such as dram__bytes.sum")
            out.append(name)
    return tuple(out)


def is_raw(name: str) -> bool:
    """Whether ``name`` has the form of a raw CUPTI metric (``unit__counter[.rollup...]``)."""
    return "__" in name and " " not in name


def expand(names: Iterable[str]) -> list[tuple[str, bool]]:
    """``names`` with every group opened: (name, whether it came from a group), without duplicates.

    Args:
        names: parsed metric names.

    Returns:
        The individual metric names, in order.
    """
    out: dict[str, bool] = {}
    for name in names:
        for member in GROUPS.get(name, (name,)):
            out.setdefault(member, name in GROUPS)
    return list(out.items())


def objective_direction(name: str) -> str:
    """How ``mneme tune --objective NAME`` ranks a hardware metric: ``minimize`` or ``maximize``.

    Args:
        name: a curated metric with a better direction, or a raw metric name (minimized).

    Returns:
        The Optuna direction.

    Raises:
        ConfigurationError: a group, or a curated metric with no better direction (a throughput in percent
            of peak is not better when higher: a faster kernel can show less).
    """
    metric = CURATED.get(name)
    if metric is None:
        if name in GROUPS or not is_raw(name):
            raise ConfigurationError(f"--objective {name}: give one metric (time, speedup, a curated metric such as "
                                     "dram_bytes, or a raw CUPTI metric, minimized)")
        return "minimize"
    if not metric.better:
        raise ConfigurationError(f"--objective {name}: {metric.description} is not better when lower or higher; "
                                 "rank by time and record it with --metrics")
    return "minimize" if metric.better == "lower" else "maximize"


@dataclass(frozen=True)
class MetricPlan:
    """Metric names resolved on one chip.

    Attributes:
        chip: CUPTI's name of the chip (``GH100``).
        names: the metrics a result reports, in order (groups opened; members the chip lacks left out).
        raw: the raw CUPTI metric of each name.
        missing: group members the chip does not have.
    """

    chip: str
    names: tuple[str, ...]
    raw: tuple[str, ...]
    missing: tuple[str, ...] = ()


def resolve(names: Iterable[str], chip: str, native: Any) -> MetricPlan:
    """The raw CUPTI metric of every name on ``chip``, checked by CUPTI's host side (no GPU needed).

    Args:
        names: parsed metric names (:func:`parse_metric_names`).
        chip: CUPTI's chip name (``GH100``; ``mneme._engine.profiler_chip_name(device)``).
        native: the engine module (``mneme._engine``, or a stand-in).

    Returns:
        The plan.

    Raises:
        ConfigurationError: a curated metric the chip has none of, or a raw name it does not know (with
            close names it does know).
    """
    out_names, raw, missing = [], [], []
    for name, grouped in expand(names):
        metric = CURATED.get(name)
        candidates = metric.raw if metric is not None else (name,)
        found = next((c for c in candidates if _valid(native, chip, c)), None)
        if found is not None:
            out_names.append(name)
            raw.append(found)
        elif grouped:
            missing.append(name)
        elif metric is not None:
            raise ConfigurationError(f"metric {name}: the {chip} has none of its raw metrics "
                                     f"({', '.join(candidates)})")
        else:
            raise ConfigurationError(f"metric {name}: the {chip} has no such metric{_close_raw(native, chip, name)}")
    if not out_names:
        raise ConfigurationError(f"none of the metrics {', '.join(names)} exists on the {chip}")
    return MetricPlan(chip, tuple(out_names), tuple(raw), tuple(missing))


def _valid(native: Any, chip: str, raw: str) -> bool:
    try:
        native.profiler_metric_properties(chip, raw)
    except native.ProfilerError as exc:
        if _code(exc) == INVALID_METRIC_NAME:
            return False
        raise NotAvailableError(f"cannot check metric {raw} on the {chip}: {exc}") from None
    return True


def _close_raw(native: Any, chip: str, name: str) -> str:
    """'; close names: ...' for a raw name the chip does not know ('' when none is close)."""
    base, _, suffix = name.partition(".")
    types = {}
    for t in METRIC_TYPES:
        for b in native.profiler_base_metrics(chip, t):
            types.setdefault(b, t)
    if base in types:  # the base is right: its suffixes
        subs = native.profiler_sub_metrics(chip, base, types[base])
        return _close("." + suffix, subs, prefix=base, cutoff=0.4)
    return _close(base, list(types), suffix="." + suffix if suffix else "")


def _close(word: str, choices: Iterable[str] | None = None, *, prefix: str = "", suffix: str = "",
           cutoff: float = 0.6) -> str:
    close = difflib.get_close_matches(word, list(choices if choices is not None else _known()), n=5, cutoff=cutoff)
    return f"; close names: {', '.join(prefix + c + suffix for c in close)}" if close else ""


def _known() -> list[str]:
    return [*CURATED, *GROUPS]


def _code(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    return int(args[1]) if len(args) > 1 and isinstance(args[1], int) else None


def explain(exc: BaseException, support: dict | None = None) -> str:
    """One line for a profiler error: the cause (and the fix) when it is the host's, else CUPTI's message.

    Args:
        exc: the engine's ProfilerError (message, CUptiResult, its name, the call), or another exception.
        support: ``profiler_device_support(device)`` when known: names what the device lacks.

    Returns:
        The message, starting with ``hardware counters cannot be collected``.
    """
    code = _code(exc)
    call = exc.args[3] if len(getattr(exc, "args", ())) > 3 else ""
    cause = CAUSES.get(code) if code is not None else None
    if cause is None:
        lacking = [why for field, why in _SUPPORT_FIELDS.items()
                   if support and support.get(field, _SUPPORTED) not in (_SUPPORTED, 0)]
        cause = "; ".join(lacking) if lacking else str(exc.args[0] if getattr(exc, "args", ()) else exc)
        if lacking:
            cause += f" ({exc.args[0] if exc.args else exc})"
    elif call:
        cause += f" [{call}]"
    return f"hardware counters cannot be collected: {cause}"


class CounterProfiler:
    """Collects hardware counters over launches of one context's replays.

    Resolved plans and CUPTI configurations are kept per metric list; the chip and its counter
    availability are looked up once.

    Attributes:
        device: the context's device ordinal.
        last: what the last collection did (``chip``, ``raw`` by name, ``passes``, ``missing``).
    """

    def __init__(self, ctx: Any, native: Any):
        """Profile on ``ctx`` with the engine module ``native``.

        Args:
            ctx: the engine's context.
            native: ``mneme._engine`` (or the fake engine's stand-in).
        """
        self.ctx, self.native, self.device = ctx, native, int(getattr(ctx, "device", 0))
        self.last: dict[str, Any] = {}
        self._chip: str | None = None
        self._availability: bytes | None = None
        self._plans: dict[tuple[str, ...], MetricPlan] = {}
        self._configs: dict[tuple[str, ...], Any] = {}

    def unavailable_reason(self) -> str:
        """Why counters cannot be collected in this process ('' when the profiler loads).

        Returns:
            The reason.
        """
        reason = self.native.profiler_unavailable_reason()
        return f"hardware counters are not available here: {reason}" if reason else ""

    @property
    def chip(self) -> str:
        """CUPTI's name of the device's chip (``GH100``)."""
        if self._chip is None:
            self._chip = self._call(lambda: self.native.profiler_chip_name(self.device))
        return self._chip

    def plan(self, names: Iterable[str]) -> MetricPlan:
        """``names`` resolved on this device's chip (cached).

        Args:
            names: parsed metric names.

        Returns:
            The plan.

        Raises:
            ConfigurationError: an unknown metric; NotAvailableError: no profiler here.
        """
        key = tuple(names)
        plan = self._plans.get(key)
        if plan is None:
            reason = self.unavailable_reason()
            if reason:
                raise NotAvailableError(reason)
            plan = self._plans[key] = resolve(key, self.chip, self.native)
        return plan

    def config(self, plan: MetricPlan) -> Any:
        """The engine's MetricConfig of a plan (cached).

        Args:
            plan: a plan of this device.

        Returns:
            ``mneme._engine.MetricConfig``.
        """
        config = self._configs.get(plan.raw)
        if config is None:
            if self._availability is None:
                self._availability = self._call(lambda: self.native.profiler_counter_availability(self.ctx))
            config = self._configs[plan.raw] = self._call(
                lambda: self.native.MetricConfig(plan.chip, list(plan.raw), self._availability))
        return config

    def collect(self, names: Iterable[str], run: Any) -> dict[str, float]:
        """The metrics' values over one profiled launch.

        Args:
            names: parsed metric names.
            run: ``run(config) -> dict`` makes the passes (``mneme._engine.profile``'s output).

        Returns:
            ``{name: value}`` in the plan's order.

        Raises:
            ConfigurationError: an unknown metric; NotAvailableError: the profiler cannot run here (the
                message names the cause); the engine's CudaError from the launches.
        """
        plan = self.plan(names)
        config = self.config(plan)
        out = self._call(lambda: run(config))
        if out.get("ranges_dropped"):
            raise NotAvailableError(f"hardware counters: CUPTI dropped {out['ranges_dropped']} range(s) of the "
                                    "profiled launch")
        self.last = {"chip": plan.chip, "raw": dict(zip(plan.names, plan.raw)), "passes": int(out["passes"]),
                     "missing": list(plan.missing)}
        return {name: float(value) for name, value in zip(plan.names, out["values"])}

    def _call(self, action: Any) -> Any:
        """``action()``; a ProfilerError becomes a NotAvailableError naming the cause."""
        try:
            return action()
        except self.native.ProfilerError as exc:
            raise NotAvailableError(explain(exc, self._support())) from None

    def _support(self) -> dict | None:
        try:
            return dict(self.native.profiler_device_support(self.device))
        except Exception:  # noqa: BLE001 - only an explanation's detail
            return None
