"""Launching a replay's code: the code on the device, the launch checks, and the engine's launch loop.

One job: turn a configuration's code into launches on the instance's device
state. A :class:`Launcher` compiles (``compile.compile_for``) and loads code
(a module cache keyed by the code's content: the module globals located, the
argument bytes patched for where this module and the heap put the recorded
ranges), refuses a launch the driver would refuse less clearly (threads per
block, dynamic shared memory, the recorded cluster), and makes one engine call
per replay: a full reset, then the launches with the given resets before them
and comparisons after some of them, queued ahead of the GPU, timed with events
or CUPTI, bounded by the watchdog. What goes wrong becomes a :class:`RunFailure`
with the result's status; a driver error that destroys the CUDA context marks
the launcher unhealthy for good.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from mneme.errors import ArtifactError, ConfigurationError, MnemeError, NotAvailableError
from mneme.model.experiment import (
    STATUS_COMPILE_ERROR,
    STATUS_INVALID_CONFIG,
    STATUS_INVALID_LAUNCH,
    STATUS_RUNTIME_ERROR,
    STATUS_TIMEOUT,
    ExperimentConfiguration,
)
from mneme.replay import engine as eng
from mneme.replay.compile import CompiledCode, CompileError, CompileOptions, compile_for, needs_recompile
from mneme.replay.launch_attrs import LaunchPlan
from mneme.replay.state import DeviceState
from mneme.replay.textures import split_resets

#: Dynamic shared memory above this needs the kernel's opt-in attribute.
DEFAULT_DYNAMIC_SHARED_LIMIT = 48 * 1024
#: Loaded modules a Launcher keeps (least recently used first out).
MODULE_CACHE_ENTRIES = 32
#: How a replay times its launches: CUDA events around each, or CUPTI activity records of the kernel.
TIMINGS = ("events", "cupti")


class RunFailure(Exception):
    """A replay that ends before a verdict, as its failed result says it.

    Args:
        status: the result's status (one of ``mneme.model.experiment.STATUSES``).
        error: the result's error.
        **fields: other fields of the result (``executed``).
    """

    def __init__(self, status: str, error: str, **fields: Any):
        super().__init__(error)
        self.status, self.error, self.fields = status, error, fields


@dataclass(frozen=True)
class LaunchSettings:
    """How a replay launches and times (see :class:`mneme.replay.Replayer`'s arguments of the same names).

    Attributes:
        queue_ahead: keep the GPU busy while the launches are enqueued.
        l2_scrub: read a scratch buffer after the resets.
        timing: ``events`` or ``cupti``.
        timeout_s: when > 0, bounds each engine call's wait for the GPU.
    """

    queue_ahead: bool = True
    l2_scrub: bool = False
    timing: str = "events"
    timeout_s: float = 0.0

    def __post_init__(self) -> None:
        if self.timing not in TIMINGS:
            raise ConfigurationError(f"timing={self.timing!r}: use 'events' or 'cupti'")
        if self.timing == "cupti":
            reason = eng.load_engine().cupti_unavailable_reason()
            if reason:
                raise NotAvailableError(f"CUPTI timing is not available here: {reason}; use timing='events'")
        object.__setattr__(self, "timeout_s", float(self.timeout_s))


@dataclass
class LoadedCode:
    """A module loaded in this context, with what a launch of its kernel needs."""

    code: CompiledCode
    module: Any
    function: Any
    attributes: dict[str, int]
    global_homes: dict[int, int]  # recorded global base -> address in this module
    args: bytes  # the argument buffer with pointers translated for this module
    param_offsets: list[int]  # where each parameter starts in args (empty: pass args as one buffer)
    load_seconds: float  # the driver's module load, counted once: by the run that loaded it
    check_plan: Any = None  # (the bounds it was planned with, judge.CheckPlan): the replayer's, per code


class Launcher:
    """Compiles, loads and launches one recorded kernel on a replay's device state.

    ``healthy`` is true until a driver error destroys the CUDA context (or the
    launcher is closed); the process must then be replaced.
    """

    def __init__(
        self,
        ctx: Any,
        arch: str,
        recording: Any,
        instance: Any,
        state: DeviceState,
        settings: LaunchSettings,
        compile_options: CompileOptions,
    ):
        """Launch ``instance`` of ``recording`` on ``state`` in the context ``ctx``.

        Args:
            ctx: the engine's context on the replay's GPU.
            arch: the GPU's architecture (``sm_90``), which code is compiled for.
            recording: the :class:`mneme.recording.execution.RecordedExecution` (the kernel, its code).
            instance: the recorded instance (argument bytes, pointer arguments, launch shape).
            state: the instance's memory on the device (:class:`mneme.replay.state.DeviceState`).
            settings: how launches are queued, timed and bounded.
            compile_options: replay-time compile settings (register cap).
        """
        self.ctx, self.arch, self.recording, self.instance = ctx, arch, recording, instance
        self.state, self.settings, self.compile_options = state, settings, compile_options
        self.healthy = True
        self._modules: OrderedDict[str, LoadedCode] = OrderedDict()
        self._recorded: CompiledCode | None = None  # the recorded launch's code, once made

    # -- code --------------------------------------------------------------------------------
    def compile(self, config: ExperimentConfiguration) -> CompiledCode:
        """The code ``config`` runs on this GPU (CPU work; cached by content).

        Args:
            config: the configuration.

        Returns:
            The compiled code (the recorded cubin for the baseline).
        """
        return compile_for(self.recording, self.instance, config, self.arch, self.compile_options)

    def _code(self, config: ExperimentConfiguration) -> CompiledCode:
        """:meth:`compile`, with the recorded launch's code kept once made (the same for every
        configuration that runs it: a launch-shape sweep asks for it once per configuration)."""
        if needs_recompile(config, self.compile_options):
            return self.compile(config)
        if self._recorded is None:
            self._recorded = self.compile(config)
        return self._recorded

    def load(self, code: CompiledCode) -> LoadedCode:
        """``code`` loaded in this context (cached by the code's key), its globals located and the
        argument bytes patched for where this module and the heap put the recorded ranges.

        Args:
            code: compiled code.

        Returns:
            The loaded code.

        Raises:
            ArtifactError: the recorded module lacks a global the recording restores, or one is smaller.
            Exception: the engine's CudaError when the driver cannot load the module.
        """
        key = code.key or f"recorded:{code.arch}:{len(code.image)}"
        modules = self._modules
        if key in modules:
            modules.move_to_end(key)
            return modules[key]
        module = self.ctx.load_module(code.image)
        function = module.function(self.recording.kernel_name)
        homes: dict[int, int] = {}
        for r in self.state.regions:
            if r.kind != "global" or not r.name:
                continue
            try:
                address, size = module.global_(r.name)
            except Exception as exc:
                if eng.cuda_error_code(exc) is None:
                    raise
                if code.tier == "recorded":
                    raise ArtifactError(
                        f"the recorded module has no global {r.name!r} the recording restores; "
                        "the recording's code and snapshots do not belong together"
                    ) from None
                continue  # pruned from a recompiled module
            if size < r.size:
                raise ArtifactError(f"global {r.name} has {size} bytes in the module, the recording {r.size}")
            homes[r.recorded_base] = address
        rmap = self.state.relocation_map(homes)
        args = self.state.patch_handles(rmap.patch_args(self.instance.arguments, self._pointer_offsets()))
        loaded = LoadedCode(
            code, module, function, function.attributes(), homes, args, param_offsets(function, len(args)),
            module.load_seconds,
        )
        modules[key] = loaded
        while len(modules) > MODULE_CACHE_ENTRIES:
            modules.popitem(last=False)
        return loaded

    def _pointer_offsets(self) -> list[int]:
        offsets = set(self.instance.pointer_args)
        offsets.update(p.offset for p in self.recording.kernel.params if p.kind == "pointer")
        return sorted(offsets)

    def prepare(self, config: ExperimentConfiguration, compiled: CompiledCode | None = None) -> LoadedCode:
        """The code of ``config`` compiled (unless given) and loaded, for a run.

        Args:
            config: the configuration.
            compiled: its code, compiled elsewhere (a server's compile pool); None compiles it here.

        Returns:
            The loaded code.

        Raises:
            RunFailure: ``invalid_config`` (the configuration cannot be compiled as asked),
                ``compile_error`` (the compiler, the LLVM tier or the driver's module load failed),
                ``runtime_error`` (loading destroyed the context).
        """
        try:
            code = compiled if compiled is not None else self._code(config)
        except ConfigurationError as exc:
            raise RunFailure(STATUS_INVALID_CONFIG, str(exc)) from None
        except (CompileError, MnemeError) as exc:
            raise RunFailure(STATUS_COMPILE_ERROR, str(exc)) from None
        try:
            return self.load(code)
        except ArtifactError as exc:
            raise RunFailure(STATUS_COMPILE_ERROR, str(exc)) from None
        except Exception as exc:
            if self.driver_failure(exc) in eng.CONTEXT_DESTROYING:
                raise RunFailure(STATUS_RUNTIME_ERROR, f"loading the kernel destroyed the CUDA context: {exc}") from None
            raise RunFailure(STATUS_COMPILE_ERROR, f"the driver could not load the compiled kernel: {exc}") from None

    # -- launch checks ------------------------------------------------------------------------
    def set_dynamic_shared(self, loaded: LoadedCode, shared_mem: int) -> None:
        """Opt ``loaded``'s kernel into ``shared_mem`` bytes of dynamic shared memory where the default
        limit is below it.

        Args:
            loaded: the loaded code.
            shared_mem: dynamic shared memory per block, in bytes.

        Raises:
            Exception: the engine's CudaError when the driver refuses that much.
        """
        static = max(loaded.attributes.get("shared_size_bytes", 0), 0)
        if shared_mem + static > DEFAULT_DYNAMIC_SHARED_LIMIT or shared_mem > loaded.attributes.get(
            "max_dynamic_shared_size_bytes", DEFAULT_DYNAMIC_SHARED_LIMIT
        ):
            loaded.function.set_attribute("max_dynamic_shared_size_bytes", shared_mem)
            loaded.attributes["max_dynamic_shared_size_bytes"] = shared_mem

    def check_launch(self, loaded: LoadedCode, config: ExperimentConfiguration, plan: LaunchPlan) -> None:
        """Refuse a launch the driver would refuse less clearly; opt into the dynamic shared memory it needs.

        Args:
            loaded: the loaded code.
            config: the configuration.
            plan: the recorded launch attributes.

        Raises:
            RunFailure: ``invalid_launch``, saying why (more threads per block than the code can
                launch with, dynamic shared memory the driver refuses, a grid that is not a multiple
                of the recorded cluster).
        """
        attrs = loaded.attributes
        if config.threads_per_block > attrs.get("max_threads_per_block", 1024):
            raise RunFailure(
                STATUS_INVALID_LAUNCH,
                f"{config.threads_per_block} threads per block exceed what this kernel can launch with "
                f"({attrs['max_threads_per_block']}: registers or launch bounds limit it)",
            )
        try:
            self.set_dynamic_shared(loaded, config.shared_mem)
        except Exception as exc:
            if eng.cuda_error_code(exc) is None:
                raise
            raise RunFailure(STATUS_INVALID_LAUNCH, f"shared_mem={config.shared_mem} is not possible: {exc}") from None
        launch_errors = plan.launch_errors(config.grid.as_tuple())
        if launch_errors:
            raise RunFailure(STATUS_INVALID_LAUNCH, "; ".join(launch_errors))

    # -- launches -----------------------------------------------------------------------------
    def launch(
        self,
        loaded: LoadedCode,
        config: ExperimentConfiguration,
        launches: int,
        plan: LaunchPlan,
        *,
        resets: list,
        checks: list,
        check_launches: list[int],
        timed: bool,
        from_recorded: bool = True,
        timeout_s: float | None = None,
    ) -> dict:
        """One engine call: every region reset from its prologue, then ``launches`` launches of
        ``loaded`` under ``config`` with the recorded launch attributes, ``resets`` before each, the
        ``checks`` compared after the launches in ``check_launches``.

        Args:
            loaded: the loaded code.
            config: the launch shape.
            launches: how many launches.
            plan: the recorded launch attributes.
            resets: (dst, src, size) copies before each launch (``textures.ArrayCopy``: a CUDA array filled).
            checks: the engine's comparisons (``tolerance.engine_check``).
            check_launches: the launches after which they are made.
            timed: a configuration's replay: queued ahead, the L2 scrubbed after resets, timed with
                CUPTI when so set (else the engine's defaults: a proof's or a probe's launches).
            from_recorded: reset every region from its prologue first (False: start from what the
                previous call left: the proof's second launch).
            timeout_s: this call's watchdog, when not the replayer's.

        Returns:
            The engine's output (``times_ns``, ``event_times_ns``, ``checked_launches``, ``checks``,
            ``wall_ns``, ``gpu_span_ns``).

        Raises:
            Exception: the engine's CudaError (a configuration's replay reports it as :meth:`run_failure`).
        """
        state, homes, settings = self.state, loaded.global_homes, self.settings
        state.apply_map(state.relocation_map(homes))
        if from_recorded:
            state.full_reset(homes)
        linear_resets, array_resets = split_resets(resets)
        readbacks = state.array_readbacks()  # the CUDA arrays, copied where the checks read them
        arrays = {"array_resets": array_resets, "array_readbacks": readbacks} if readbacks else {}
        return loaded.function.run(
            config.grid.as_tuple(),
            config.block.as_tuple(),
            config.shared_mem,
            loaded.args,
            launches,
            resets=linear_resets,
            checks=checks,
            check_launches=check_launches,
            queue_ahead_ns=queue_ahead_ns(launches) if timed and settings.queue_ahead else 0,
            l2_scrub_bytes=2 * self.ctx.l2_cache_size if timed and settings.l2_scrub and _bytes(resets) else 0,
            timeout_s=settings.timeout_s if timeout_s is None else timeout_s,
            cupti=timed and settings.timing == "cupti",
            attributes=list(plan.attributes),
            param_offsets=loaded.param_offsets,
            **arrays,
        )

    def profile(self, loaded: LoadedCode, config: ExperimentConfiguration, plan: LaunchPlan, metric_config: Any) -> dict:
        """Hardware counters over one launch of ``loaded`` under ``config`` (an engine call of its own, after
        a configuration's timed launches): per profiler pass every region reset from its prologue and the L2
        flushed, then the launch with the recorded launch attributes.

        Args:
            loaded: the loaded code.
            config: the launch shape.
            plan: the recorded launch attributes.
            metric_config: the engine's ``MetricConfig`` (the metrics and their passes).

        Returns:
            The engine's output (``values`` in the configuration's metric order, ``passes``, ``ranges_dropped``).

        Raises:
            Exception: the engine's ProfilerError (CUPTI) or CudaError (the launches).
        """
        state, homes = self.state, loaded.global_homes
        state.apply_map(state.relocation_map(homes))
        return eng.load_engine().profile(
            loaded.function, metric_config, config.grid.as_tuple(), config.block.as_tuple(), config.shared_mem,
            loaded.args, resets=state.full_reset_copies(homes), l2_flush_bytes=2 * self.ctx.l2_cache_size,
            timeout_s=self.settings.timeout_s, attributes=list(plan.attributes), param_offsets=loaded.param_offsets,
        )

    def batch_item(
        self,
        loaded: LoadedCode,
        config: ExperimentConfiguration,
        launches: int,
        plan: LaunchPlan,
        *,
        before: list,
        resets: list,
        checks: list,
        check_launches: list[int],
    ) -> tuple:
        """One configuration of an engine call shared by several (:meth:`start_batch`): as :meth:`launch`'s
        timed replay from the recorded memory, with the full reset as the item's first copies.

        Args:
            loaded: the loaded code.
            config: the launch shape.
            launches: how many launches.
            plan: the recorded launch attributes.
            before: (dst, src, size) copies before the first launch (``DeviceState.full_reset_copies``).
            resets: (dst, src, size) copies before each launch.
            checks: the engine's comparisons.
            check_launches: the launches after which they are made.

        Returns:
            The engine's batch item.
        """
        return (loaded.function, config.grid.as_tuple(), config.block.as_tuple(), config.shared_mem, loaded.args,
                launches, before, resets, checks, check_launches, list(plan.attributes), loaded.param_offsets)

    def start_batch(self, items: list[tuple]) -> Any:
        """Enqueue several configurations in one engine call (``Context.start_batch``) without waiting for
        the GPU: the next batch can be enqueued while this one runs.

        Args:
            items: :meth:`batch_item`'s tuples.

        Returns:
            The engine's batch: its ``wait(timeout_s)`` gives the output of each configuration, as
            :meth:`launch` gives it, or raises the engine's CudaError (which configuration caused it is
            not known).

        Raises:
            Exception: the engine's CudaError when the driver refused to enqueue.
        """
        return self.ctx.start_batch(items)

    def wait_batch(self, batch: Any) -> list[dict]:
        """What a batch of :meth:`start_batch` gave, once the GPU is done (the replayer's watchdog bounds
        the wait).

        Args:
            batch: the engine's batch.

        Returns:
            The engine's output of each configuration.
        """
        return batch.wait(timeout_s=self.settings.timeout_s)

    def run_failure(self, exc: Exception) -> RunFailure:
        """What a configuration's replay that raised ``exc`` in :meth:`launch` reports.

        Args:
            exc: what the engine call raised.

        Returns:
            ``invalid_launch`` (the driver refused the launch), or ``runtime_error`` / ``timeout``
            (the kernel failed; when that destroyed the context, the launcher is unhealthy from now on).

        Raises:
            Exception: ``exc`` itself when it is not a driver error (a bug of ours).
        """
        code_no = self.driver_failure(exc)
        if code_no in eng.LAUNCH_REFUSED:
            return RunFailure(STATUS_INVALID_LAUNCH, f"the driver refused the launch: {exc}")
        if code_no in eng.CONTEXT_DESTROYING:
            return RunFailure(
                STATUS_TIMEOUT if code_no == eng.TIMEOUT_CODE else STATUS_RUNTIME_ERROR,
                f"the kernel failed ({exc}); the CUDA context is destroyed: this replayer must be dropped "
                "and the process replaced",
                executed=True,
            )
        return RunFailure(STATUS_RUNTIME_ERROR, f"the replay failed: {exc}", executed=True)

    def timing(self, out: dict, launches: int, reset_each_launch: bool) -> dict[str, Any]:
        """What a replay's launches took (``Replayer.last_timing``).

        Args:
            out: the engine's output of the replay.
            launches: how many launches it made.
            reset_each_launch: whether the written memory was reset before every launch.

        Returns:
            ``wall_ns``, ``gpu_span_ns``, ``queue_ahead_ns``, ``launches``, ``times_ns``,
            ``event_times_ns``, ``checked_launches``, ``reset_each_launch``.
        """
        return {
            "wall_ns": out["wall_ns"],
            "gpu_span_ns": out["gpu_span_ns"],
            "queue_ahead_ns": queue_ahead_ns(launches) if self.settings.queue_ahead else 0,
            "launches": launches,
            "times_ns": list(out["times_ns"]),
            "event_times_ns": list(out["event_times_ns"]),
            "checked_launches": list(out["checked_launches"]),
            "reset_each_launch": reset_each_launch,
        }

    # -- the context ---------------------------------------------------------------------------
    def driver_failure(self, exc: Exception) -> int:
        """The CUresult of a driver error; one that destroys the context loses it.

        Args:
            exc: what an engine call raised.

        Returns:
            The CUresult.

        Raises:
            Exception: ``exc`` itself when it is not a driver error.
        """
        code_no = eng.cuda_error_code(exc)
        if code_no is None:
            raise exc
        if code_no in eng.CONTEXT_DESTROYING:
            self.lose_context()
        return code_no

    def lose_context(self) -> None:
        """The CUDA context is gone: this launcher (and every other in the process) cannot run again."""
        self.healthy = False
        eng.load_engine().abandon_cleanup()  # freeing on a dead or busy context could block forever

    def close(self) -> None:
        """Drop the loaded modules; the launcher cannot launch afterwards."""
        self._modules.clear()
        self.healthy = False


def measurements(code: CompiledCode, loaded: LoadedCode) -> dict[str, Any]:
    """The result fields the code gives (sizes, registers, compile and load times); the module's load
    time is counted once, by the first run that gets it.

    Args:
        code: the compiled code.
        loaded: the same code loaded.

    Returns:
        ``obj_size``, ``reg_usage``, ``local_mem_usage``, ``const_mem_usage``, ``shared_mem_usage``,
        ``codegen_time``, ``opt_time``, ``preprocess_ir_time``, ``compile_cached``.
    """
    attrs = loaded.attributes
    load_seconds, loaded.load_seconds = loaded.load_seconds, 0.0
    return {
        "obj_size": code.obj_size,
        "reg_usage": attrs.get("num_regs", -1),
        "local_mem_usage": attrs.get("local_size_bytes", -1),
        "const_mem_usage": attrs.get("const_size_bytes", -1),
        "shared_mem_usage": attrs.get("shared_size_bytes", -1),
        "codegen_time": code.codegen_time + load_seconds,
        "opt_time": code.opt_time,
        "preprocess_ir_time": code.preprocess_ir_time,
        "compile_cached": code.cached,
    }


def param_offsets(function: Any, arg_bytes: int) -> list[int]:
    """Where the loaded function's parameters start, when its layout fits the recorded bytes.

    Launching with one pointer per parameter (as cudart does) works for every
    launch kind, cooperative ones included, and for parameter buffers up to the
    driver's 32 764 bytes; without a layout the bytes go as one buffer.

    Args:
        function: the engine's loaded function.
        arg_bytes: the size of the recorded argument bytes.

    Returns:
        The parameters' offsets; empty when the driver gives no layout or it does not fit.
    """
    try:
        layout = function.param_info()
    except Exception as exc:
        if eng.cuda_error_code(exc) is None:
            raise
        return []
    if not layout or any(offset + size > arg_bytes for offset, size in layout):
        return []
    return [offset for offset, _ in layout]


def queue_ahead_ns(launches: int) -> int:
    """How long the GPU spins while the loop is enqueued: 20 us of host work per launch and 20 us more, at most 10 ms.

    Args:
        launches: the launches of one engine call.

    Returns:
        Nanoseconds.
    """
    return min(20_000 + 20_000 * launches, 10_000_000)


def _bytes(resets: list) -> int:
    return sum(r[2] for r in resets)  # (dst, src, size), or a textures.ArrayCopy: its size is third too
