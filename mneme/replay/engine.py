"""Access to the native engine (``mneme._engine``) and the meaning of its errors.

Importing this module never touches CUDA; ``load_engine`` imports the
extension and ``require_driver`` says, as a NotAvailableError, why replay
cannot run here (extension not built, no driver, no GPU).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from mneme.errors import NotAvailableError
from mneme.startup_trace import mark

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

#: The recorder's default window (native/recorder settings: va_base). The driver
#: takes large address ranges for itself at its first allocation in a process,
#: which can swallow this one, and a range it has freed cannot be reserved at
#: the same address again. So the first context a process opens reserves the
#: window once, for good, and replays map and unmap their pages inside it.
#: Host mappings (shared libraries, with ASLR anywhere in the top terabyte) can sit
#: inside a large window, so the reservation tries smaller sizes before giving up.
GUARD_BASE = 0x7F0000000000
GUARD_SIZES = tuple(gib << 30 for gib in (256, 64, 16, 4, 1))
_window: "SharedWindow | None" = None
_window_tried = False


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
    """True when replay can run here (engine built, driver loaded, a GPU visible)."""
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
    """An engine Context on ``device``; the first one in the process also reserves the recorder's window."""
    global _window, _window_tried
    native = require_driver()
    ctx = native.Context(device)
    if not _window_tried:
        mark("engine", "context")
        _window_tried = True
        for size in GUARD_SIZES:
            try:
                _window = SharedWindow(ctx.reserve(GUARD_BASE, size))
                break
            except native.CudaError:
                continue  # taken (partly): try a smaller window; none at all means replays relocate
        mark("engine", "window")
    return ctx


class SharedWindow:
    """The process's reservation of the recorder's window; replays lease page spans of it."""

    def __init__(self, reservation: Any):
        self.reservation = reservation
        self.base = reservation.base
        self.size = reservation.size
        self.busy: list[tuple[int, int]] = []  # leased (offset, size) spans

    def lease(self, spans: list[tuple[int, int]], device: int) -> "WindowLease":
        """Map ``spans`` (offsets from the window base) on ``device``; ValueError when one is outside or leased."""
        for off, size in spans:
            if off < 0 or off + size > self.size:
                raise ValueError(f"range {self.base + off:#x}+{size} is outside the reserved window")
            for b_off, b_size in self.busy:
                if off < b_off + b_size and b_off < off + size:
                    raise ValueError(f"range {self.base + off:#x}+{size} is in use by another replay in this process")
        done: list[tuple[int, int]] = []
        try:
            for off, size in spans:
                self.reservation.map(off, size, device)
                done.append((off, size))
        except Exception:
            for off, size in done:
                self.reservation.unmap(off, size)
            raise
        self.busy.extend(done)
        return WindowLease(self, done)


class WindowLease:
    """Pages of the shared window mapped for one replay; ``release`` unmaps them."""

    def __init__(self, window: SharedWindow, spans: list[tuple[int, int]]):
        self.window = window
        self.spans = spans
        self.mapped_bytes = sum(s for _, s in spans)

    def release(self) -> None:
        for span in self.spans:
            self.window.reservation.unmap(*span)
            self.window.busy.remove(span)
        self.spans = []
        self.mapped_bytes = 0


def shared_window() -> SharedWindow | None:
    return _window
