"""The GPU as NVML sees it (through nvidia-ml-py, imported as ``pynvml``): clocks, temperature, power,
clock-event (throttle) reasons, the energy counter, and clock locks.

One module for every user: the replays' measurement conditions and energy window
(:mod:`mneme.replay.measurement`), ``mneme serve --lock-clocks`` (``replay_server.server.clocks``) and the
benchmarks. NVML is imported and initialized once per process, lazily; a GPU is found by the PCI bus id
the CUDA driver gives for the device (NVML numbers the GPUs its own way, and ``CUDA_VISIBLE_DEVICES``
renumbers CUDA's). Where NVML cannot be used (nvidia-ml-py missing, no NVML library, no GPU), every
function says why (:func:`unavailable_reason`, :class:`mneme.errors.NotAvailableError`): a value NVML
did not give is absent, never a zero.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any, Callable

from mneme.errors import NotAvailableError

log = logging.getLogger("mneme.nvml")

# NVML's codes and constants (nvml.h), so that what a value means is written here, not looked up.
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
CLOCK_SM, CLOCK_MEM = 1, 2
TEMPERATURE_GPU = 0
CLOCK_LIMIT_ID_TDP = 0xFFFFFF01  # nvmlClockLimitId_t: the base (TDP) clock, as nvidia-smi --lock-gpu-clocks=tdp
#: Clock-event reasons (nvmlClocksEventReason*, formerly "throttle reasons"), bit -> name.
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}
#: The reasons that slow the GPU below what it was asked to run at: a measurement taken while one holds
#: is a throttled measurement. (Idle, the applications' or locked clocks, sync boost and the display clock
#: are the GPU doing as configured.)
THROTTLING = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                        "hw_power_brake_slowdown", "board_limit", "reliability"})
#: ``mneme serve --lock-clocks`` modes.
LOCK_MODES = ("off", "base", "max")

_lock = threading.RLock()
_pynvml: Any = None
_init_error: str | None = None  # None: not tried; "": initialized; else why NVML cannot be used
_devices: dict[str, "Device"] = {}
_said: set[str] = set()


def _module() -> Any:
    """``pynvml``, initialized once per process.

    Raises:
        NotAvailableError: why NVML cannot be used here.
    """
    global _pynvml, _init_error
    with _lock:
        if _init_error is None:
            try:
                import pynvml
            except ImportError:
                _init_error = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            else:
                try:
                    pynvml.nvmlInit()
                except Exception as exc:  # pynvml.NVMLError, or OSError from ctypes
                    _init_error = f"NVML did not initialize: {describe(exc)}"
                else:
                    _pynvml, _init_error = pynvml, ""
        if _init_error:
            raise NotAvailableError(_init_error)
        return _pynvml


def unavailable_reason() -> str:
    """Why NVML cannot be used in this process.

    Returns:
        '' when it can; else the reason (nvidia-ml-py missing, the NVML library not found, no GPU).
    """
    try:
        _module()
    except NotAvailableError as exc:
        return str(exc)
    return ""


def describe(exc: BaseException) -> str:
    """An NVML error as one line: its name and code (``Insufficient Permissions (NVML error 4)``).

    Args:
        exc: what a pynvml call raised.

    Returns:
        The line.
    """
    code = getattr(exc, "value", None)
    return f"{exc} (NVML error {code})" if isinstance(code, int) else f"{type(exc).__name__}: {exc}"


def error_code(exc: BaseException) -> int | None:
    """The NVML return code of a pynvml error (None for any other exception).

    Args:
        exc: an exception.

    Returns:
        The code.
    """
    code = getattr(exc, "value", None)
    return code if isinstance(code, int) and type(exc).__name__.startswith("NVMLError") else None


def say_once(message: str, logger: logging.Logger | None = None) -> bool:
    """Log ``message`` as a warning the first time this process says it.

    Args:
        message: the message.
        logger: where (default this module's logger).

    Returns:
        True when it was said now, False when it had been said before.
    """
    with _lock:
        if message in _said:
            return False
        _said.add(message)
    (logger or log).warning("%s", message)
    return True


def decode_reasons(mask: int) -> list[str]:
    """The names of the clock-event reasons set in ``mask`` (unknown bits as ``0x...``).

    Args:
        mask: nvmlDeviceGetCurrentClocksEventReasons' bit mask.

    Returns:
        Names, in bit order.
    """
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    return names + ([f"0x{unknown:x}"] if unknown else [])


def throttling(reasons: list[str]) -> list[str]:
    """The reasons among ``reasons`` that throttle the GPU (:data:`THROTTLING`).

    Args:
        reasons: clock-event reason names.

    Returns:
        Those that throttle, in their order.
    """
    return [r for r in reasons if r in THROTTLING]


class Device:
    """One GPU through NVML.

    Attributes:
        pci_bus_id: the GPU's PCI bus id.
        handle: NVML's handle.
    """

    def __init__(self, nvml: Any, handle: Any, pci_bus_id: str) -> None:
        self._nvml, self.handle, self.pci_bus_id = nvml, handle, pci_bus_id
        self._energy_error: str | None = None  # None: not tried yet

    def _call(self, name: str, *args: Any) -> Any:
        return getattr(self._nvml, name)(self.handle, *args)

    def conditions(self) -> dict[str, Any]:
        """What the GPU runs at now: ``sm_clock_mhz``, ``mem_clock_mhz``, ``temperature_c``, ``power_w``,
        ``clock_event_reasons`` (names); a value NVML does not give on this GPU is absent.

        Returns:
            The reading.
        """
        out: dict[str, Any] = {}
        for key, read in (("sm_clock_mhz", lambda: int(self._call("nvmlDeviceGetClockInfo", CLOCK_SM))),
                          ("mem_clock_mhz", lambda: int(self._call("nvmlDeviceGetClockInfo", CLOCK_MEM))),
                          ("temperature_c", lambda: int(self._call("nvmlDeviceGetTemperature", TEMPERATURE_GPU))),
                          ("power_w", lambda: round(self._call("nvmlDeviceGetPowerUsage") / 1000.0, 3)),
                          ("clock_event_reasons", lambda: decode_reasons(int(self._reasons())))):
            try:
                out[key] = read()
            except Exception as exc:  # noqa: BLE001 - NOT_SUPPORTED on this GPU, or a transient failure
                if error_code(exc) is None:
                    raise
        return out

    def _reasons(self) -> int:
        reasons = getattr(self._nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)  # NVML 12.535 and newer
        if reasons is None:
            return self._call("nvmlDeviceGetCurrentClocksThrottleReasons")
        return reasons(self.handle)

    def energy_mj(self) -> int:
        """The GPU's total energy counter (millijoules since the driver was loaded; Volta and newer).

        Returns:
            The counter.

        Raises:
            NotAvailableError: the counter cannot be read here, and why.
        """
        try:
            return int(self._call("nvmlDeviceGetTotalEnergyConsumption"))
        except Exception as exc:
            if error_code(exc) is None:
                raise
            why = ("this GPU or driver has no energy counter" if error_code(exc) == ERROR_NOT_SUPPORTED
                   else "reading it failed")
            raise NotAvailableError(f"NVML's energy counter (nvmlDeviceGetTotalEnergyConsumption): {why}: "
                                    f"{describe(exc)}") from None

    def energy_unavailable_reason(self) -> str:
        """Why the energy counter cannot be read (asked once per device and process).

        Returns:
            '' when it can.
        """
        if self._energy_error is None:
            try:
                self.energy_mj()
                self._energy_error = ""
            except NotAvailableError as exc:
                self._energy_error = str(exc)
        return self._energy_error

    def max_clocks_mhz(self) -> tuple[int | None, int | None]:
        """The highest SM and memory clocks this GPU runs at (None where NVML does not say).

        Returns:
            (SM, memory) in MHz.
        """
        out = []
        for clock in (CLOCK_SM, CLOCK_MEM):
            try:
                out.append(int(self._call("nvmlDeviceGetMaxClockInfo", clock)))
            except Exception as exc:  # noqa: BLE001
                if error_code(exc) is None:
                    raise
                out.append(None)
        return out[0], out[1]

    def power_limits_w(self) -> tuple[float, float] | None:
        """The power limits this GPU can be set to (min, max, watts); None where NVML does not say.

        Returns:
            The limits.
        """
        try:
            low, high = self._call("nvmlDeviceGetPowerManagementLimitConstraints")
        except Exception as exc:  # noqa: BLE001
            if error_code(exc) is None:
                raise
            return None
        return low / 1000.0, high / 1000.0


def device_by_pci(pci_bus_id: str) -> Device:
    """The GPU at PCI bus id ``pci_bus_id`` (one object per GPU and process).

    Args:
        pci_bus_id: e.g. ``0000:3B:00.0``.

    Returns:
        The device.

    Raises:
        NotAvailableError: NVML cannot be used, or it does not know that GPU.
    """
    nvml = _module()
    with _lock:
        device = _devices.get(pci_bus_id)
        if device is None:
            try:
                handle = nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
            except Exception as exc:
                if error_code(exc) is None:
                    raise
                raise NotAvailableError(f"NVML does not find the GPU at PCI bus id {pci_bus_id}: "
                                        f"{describe(exc)}") from None
            device = _devices[pci_bus_id] = Device(nvml, handle, pci_bus_id)
        return device


def cuda_device(ordinal: int = 0, bus_id: Callable[[int], str] | None = None) -> Device:
    """The GPU of CUDA device ``ordinal`` as this process sees it (``CUDA_VISIBLE_DEVICES`` applied),
    found by the PCI bus id the CUDA driver gives for it.

    Args:
        ordinal: the CUDA device ordinal.
        bus_id: how to ask the driver for the bus id (default :func:`mneme._internal.devices.pci_bus_id`).

    Returns:
        The device.

    Raises:
        NotAvailableError: NVML cannot be used, or the driver does not name the device.
    """
    _module()  # NVML's reason first: the more common one
    if bus_id is None:
        from mneme._internal.devices import pci_bus_id as bus_id
    try:
        pci = bus_id(ordinal)
    except (OSError, RuntimeError) as exc:
        raise NotAvailableError(f"the CUDA driver does not give CUDA device {ordinal}'s PCI bus id, which "
                                f"NVML finds the GPU by: {exc}") from None
    return device_by_pci(pci)


class ClockLock:
    """Clocks locked on one GPU (``mneme serve --lock-clocks``), and put back.

    ``base`` locks the SM clock at the GPU's base (TDP) clock and the memory clock at its default
    applications clock; ``max`` locks both at their highest. Locking needs the right to (root, or an
    administrator's grant); a GPU that refuses says so once (:attr:`problem`) and nothing changes.
    ``restore`` (also at the process's exit) resets what was locked.

    Attributes:
        mode: ``base`` or ``max``.
        locked: what was locked: ``{"sm_clock_mhz": ..., "mem_clock_mhz": ...}`` (values NVML gave; the
            base clock as ``"base"``).
        problem: why nothing, or only part, was locked ('' when all was).
    """

    def __init__(self, device: Device, mode: str) -> None:
        if mode not in ("base", "max"):
            raise ValueError(f"lock mode {mode!r}: base or max")
        self.device, self.mode = device, mode
        self.locked: dict[str, Any] = {}
        self.problem = ""
        self._sm = self._mem = False
        self._restored = False

    def apply(self) -> str:
        """Lock the clocks.

        Returns:
            '' when both clocks are locked; else what was not and why (said once in the log).
        """
        nvml, handle = self.device._nvml, self.device.handle
        sm_max, mem_max = self.device.max_clocks_mhz()
        try:
            if self.mode == "max":
                if sm_max is None:
                    raise NotAvailableError("NVML does not give the GPU's highest SM clock")
                nvml.nvmlDeviceSetGpuLockedClocks(handle, sm_max, sm_max)
                self.locked["sm_clock_mhz"] = sm_max
            else:
                nvml.nvmlDeviceSetGpuLockedClocks(handle, CLOCK_LIMIT_ID_TDP, CLOCK_LIMIT_ID_TDP)
                self.locked["sm_clock_mhz"] = "base"
            self._sm = True
        except Exception as exc:  # noqa: BLE001
            self.problem = f"--lock-clocks {self.mode}: the clocks are not locked: {self._why(exc)}"
            say_once(self.problem)
            return self.problem
        atexit.register(self.restore)
        try:
            mem = mem_max if self.mode == "max" else int(nvml.nvmlDeviceGetDefaultApplicationsClock(handle, CLOCK_MEM))
            if mem is None:
                raise NotAvailableError("NVML does not give the GPU's highest memory clock")
            nvml.nvmlDeviceSetMemoryLockedClocks(handle, mem, mem)
            self.locked["mem_clock_mhz"] = mem
            self._mem = True
        except Exception as exc:  # noqa: BLE001 - HBM GPUs often have one memory clock and refuse
            self.problem = f"--lock-clocks {self.mode}: the memory clock is not locked: {self._why(exc)}"
            say_once(self.problem)
        return self.problem

    @staticmethod
    def _why(exc: BaseException) -> str:
        code = error_code(exc)
        if code == ERROR_NO_PERMISSION:
            return (f"not permitted ({describe(exc)}): locking clocks needs root or an administrator's grant "
                    "(nvidia-smi -acp UNRESTRICTED), and virtualized GPUs refuse it")
        if code == ERROR_NOT_SUPPORTED:
            return f"not supported on this GPU or driver ({describe(exc)})"
        if code is not None or isinstance(exc, NotAvailableError):
            return describe(exc) if code is not None else str(exc)
        raise exc

    def restore(self) -> None:
        """Reset the clocks this lock locked (once; nothing when none was)."""
        if self._restored:
            return
        self._restored = True
        nvml, handle = self.device._nvml, self.device.handle
        for locked, reset in ((self._sm, "nvmlDeviceResetGpuLockedClocks"),
                              (self._mem, "nvmlDeviceResetMemoryLockedClocks")):
            if not locked:
                continue
            try:
                getattr(nvml, reset)(handle)
            except Exception as exc:  # noqa: BLE001 - at exit: say it, go on
                log.warning("--lock-clocks: %s failed: %s; reset the clocks with nvidia-smi -rgc / -rmc",
                            reset, describe(exc))
        try:
            atexit.unregister(self.restore)
        except Exception:  # noqa: BLE001
            pass


def forget() -> None:
    """Forget the initialized NVML, its devices and what was said (tests swap ``pynvml`` for a fake)."""
    global _pynvml, _init_error
    with _lock:
        _pynvml, _init_error = None, None
        _devices.clear()
        _said.clear()
