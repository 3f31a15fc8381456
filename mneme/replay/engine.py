"""Access to the native engine (``mneme._engine``) and the meaning of its errors.

Importing this module never touches CUDA; ``load_engine`` imports the
extension and ``require_driver`` says, as a NotAvailableError, why replay
cannot run here (extension not built, no driver, no GPU).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from mneme._internal.startup_trace import mark
from mneme.errors import NotAvailableError

# CUresults after which the context is unusable (a fault in a kernel poisons the
# context: every later call returns the same error). The process must go.
CONTEXT_DESTROYING = {
    700,  # CUDA_ERROR_ILLEGAL_ADDRESS
    702,  # CUDA_ERROR_LAUNCH_TIMEOUT (also our own wait timeout: the kernel still runs)
    710,  # CUDA_ERROR_ASSERT
    714,  # CUDA_ERROR_HARDWARE_STACK_ERROR
    715,  # CUDA_ERROR_ILLEGAL_INSTRUCTION
    716,  # CUDA_ERROR_MISALIGNED_ADDRESS
    717,  # CUDA_ERROR_INVALID_ADDRESS_SPACE
    718,  # CUDA_ERROR_INVALID_PC
    719,  # CUDA_ERROR_LAUNCH_FAILED
    721,  # CUDA_ERROR_TENSOR_MEMORY_LEAK
    999,  # CUDA_ERROR_UNKNOWN
}
TIMEOUT_CODE = 702
# CUresults of a launch the driver refused: the configuration is at fault, the context is fine.
LAUNCH_REFUSED = {
    1,  # CUDA_ERROR_INVALID_VALUE (block/grid/shared memory out of range)
    9,  # CUDA_ERROR_INVALID_CONFIGURATION
    701,  # CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (registers x threads per block)
    720,  # CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
}

_engine: ModuleType | None = None
_first_context = True  # the start-up trace marks the process's first context only

def load_engine() -> ModuleType:
    """The native extension; NotAvailableError when this installation lacks it."""
    global _engine
    if _engine is None:
        try:
            from mneme import _engine as native  # type: ignore[attr-defined]
        except ImportError as exc:
            raise NotAvailableError(
                f"the native replay engine (mneme._engine) is not built in this installation ({exc}); "
                "install mneme from a wheel or build it with `pip install .` on a machine with the CUDA toolkit"
            ) from None
        _engine = native
    return _engine


def driver_available() -> bool:
    """True when replay can run here (engine built, driver loaded, a GPU visible).

    Returns:
        Whether replay can run.
    """
    try:
        return bool(load_engine().driver_available())
    except NotAvailableError:
        return False


def require_driver() -> ModuleType:
    """The engine, or NotAvailableError saying why replay cannot run on this machine."""
    native = load_engine()
    if not native.driver_available():
        raise NotAvailableError(f"cannot replay on this machine: {native.driver_unavailable_reason()}")
    return native


def cuda_error_code(exc: BaseException) -> int | None:
    """The CUresult of an engine CudaError (None for other exceptions)."""
    native = _engine
    if native is None or not isinstance(exc, native.CudaError):
        return None
    args = exc.args
    return int(args[1]) if len(args) > 1 else None


def open_context(device: int = 0) -> Any:
    """An engine Context on ``device``. The recorded heap's addresses are reserved by each replay,
    where its recording has them (``mneme.replay.placement``); the first context of a process also
    reserves the recorder's default windows at once, before the driver allocates anything for itself."""
    global _first_context
    native = require_driver()
    ctx = native.Context(device)
    if _first_context:
        _first_context = False
        mark("engine", "context")
        from mneme.recording.window import DEFAULT_VA_BASE
        from mneme.replay.placement import process_reservations

        process_reservations().guard(ctx, DEFAULT_VA_BASE)  # before the driver's own first allocations
        mark("engine", "window")
    return ctx


def device_arch(ctx: Any) -> str:
    """The architecture name of a context's GPU (``sm_90``), which code is compiled for.

    Args:
        ctx: an engine Context.

    Returns:
        ``sm_<major><minor>``.
    """
    major, minor = ctx.compute_capability
    return f"sm_{major}{minor}"
