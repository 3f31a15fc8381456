"""A stand-in for nvidia-ml-py's ``pynvml`` module, for tests without a GPU.

:func:`install` puts a :class:`FakeNvml` where ``import pynvml`` finds it and makes the CUDA driver's
PCI bus id lookup answer without a driver, so :mod:`mneme._internal.nvml` (and everything over it: the
replays' conditions and energy window, ``mneme serve --lock-clocks``) runs against it. The fake keeps
every call (``calls``), answers with the values its attributes hold, fails a call with the NVML code
``fail[name]`` names, and its energy counter advances in steps of ``energy_step_s`` at ``power_w``
watts of the real clock (as a GPU's does while it runs).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

PCI_BUS_ID = "00000000:01:00.0"
_ERROR_NAMES = {1: "Uninitialized", 2: "InvalidArgument", 3: "NotSupported", 4: "NoPermission",
                6: "NotFound", 9: "DriverNotLoaded", 12: "LibraryNotFound", 999: "Unknown"}
_ERROR_TEXT = {3: "Not Supported", 4: "Insufficient Permissions", 12: "NVML Shared Library Not Found",
               9: "Driver Not Loaded", 6: "Not Found"}


class NVMLError(Exception):
    """pynvml's error: ``value`` is NVML's return code; raised as a subclass named ``NVMLError_<Name>``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_TEXT.get(self.value, f"NVML error {self.value}")


def nvml_error(code: int) -> NVMLError:
    """The error pynvml raises for ``code`` (its subclass, as pynvml names them).

    Args:
        code: NVML's return code.

    Returns:
        The exception.
    """
    cls = type(f"NVMLError_{_ERROR_NAMES.get(code, 'Unknown')}", (NVMLError,), {})
    return cls(code)


class FakeNvml:
    """The fake ``pynvml`` (module-like: its functions are methods).

    Attributes:
        calls: (name, args) of every call, in order.
        fail: function name -> NVML code it fails with (``nvmlInit`` included).
        sm_clock, mem_clock, max_sm_clock, max_mem_clock, default_mem_clock: MHz.
        temperature: degrees C.
        power_mw: what nvmlDeviceGetPowerUsage says.
        reasons: the clock-event reasons' bit mask.
        power_w, energy_step_s: the energy counter's power and how often it steps (None: it never moves).
        known: the PCI bus ids NVML knows.
    """

    NVMLError = NVMLError

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.fail: dict[str, int] = {}
        self.sm_clock, self.mem_clock = 1980, 2619
        self.max_sm_clock, self.max_mem_clock, self.default_mem_clock = 1980, 2619, 2619
        self.temperature = 41
        self.power_mw = 123_456
        self.reasons = 0x1
        self.power_w: float = 250.0
        self.energy_step_s: float | None = 0.005
        self.energy_base_mj = 10_000_000
        self.known = {PCI_BUS_ID}
        self._t0 = time.monotonic()
        self._lock = threading.Lock()

    def _call(self, name: str, *args: Any) -> None:
        with self._lock:
            self.calls.append((name, args))
        if name in self.fail:
            raise nvml_error(self.fail[name])

    def called(self, name: str) -> list[tuple]:
        """The arguments of every call of ``name``.

        Args:
            name: a pynvml function's name.

        Returns:
            Their argument tuples, in order.
        """
        return [args for n, args in list(self.calls) if n == name]

    # -- pynvml's functions -------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._call("nvmlInit")

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> str:
        self._call("nvmlDeviceGetHandleByPciBusId", bus_id)
        if bus_id not in self.known:
            raise nvml_error(6)
        return f"handle:{bus_id}"

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        self._call("nvmlDeviceGetClockInfo", handle, clock)
        return self.sm_clock if clock == 1 else self.mem_clock

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock: int) -> int:
        self._call("nvmlDeviceGetMaxClockInfo", handle, clock)
        return self.max_sm_clock if clock == 1 else self.max_mem_clock

    def nvmlDeviceGetDefaultApplicationsClock(self, handle: Any, clock: int) -> int:
        self._call("nvmlDeviceGetDefaultApplicationsClock", handle, clock)
        return self.default_mem_clock

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        self._call("nvmlDeviceGetTemperature", handle, sensor)
        return self.temperature

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        self._call("nvmlDeviceGetPowerUsage", handle)
        return self.power_mw

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        self._call("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return self.reasons

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> tuple[int, int]:
        self._call("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        return 200_000, 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        self._call("nvmlDeviceGetTotalEnergyConsumption", handle)
        if self.energy_step_s is None:
            return self.energy_base_mj
        steps = int((time.monotonic() - self._t0) / self.energy_step_s)
        return self.energy_base_mj + int(steps * self.energy_step_s * self.power_w * 1000)

    def nvmlDeviceSetGpuLockedClocks(self, handle: Any, low: int, high: int) -> None:
        self._call("nvmlDeviceSetGpuLockedClocks", handle, low, high)

    def nvmlDeviceSetMemoryLockedClocks(self, handle: Any, low: int, high: int) -> None:
        self._call("nvmlDeviceSetMemoryLockedClocks", handle, low, high)

    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> None:
        self._call("nvmlDeviceResetGpuLockedClocks", handle)

    def nvmlDeviceResetMemoryLockedClocks(self, handle: Any) -> None:
        self._call("nvmlDeviceResetMemoryLockedClocks", handle)


def install(monkeypatch: Any, fake: FakeNvml | None = None, bus_id: str | None = PCI_BUS_ID) -> FakeNvml:
    """Make ``import pynvml`` find ``fake`` and the driver's PCI bus id lookup answer ``bus_id`` (None: the
    driver is missing), for one test (``monkeypatch``); :mod:`mneme._internal.nvml` starts afresh.

    Args:
        monkeypatch: pytest's fixture.
        fake: the fake (default a new one).
        bus_id: what ``mneme._internal.devices.pci_bus_id`` answers.

    Returns:
        The fake.
    """
    from mneme._internal import devices, nvml

    fake = fake or FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)

    def pci_bus_id(ordinal: int = 0) -> str:
        if bus_id is None:
            raise OSError("libcuda.so.1: cannot open shared object file")
        return bus_id

    monkeypatch.setattr(devices, "pci_bus_id", pci_bus_id)
    # NVML's process state starts afresh, and is put back as it was after the test.
    for name, value in (("_pynvml", None), ("_init_error", None), ("_devices", {}), ("_said", set())):
        monkeypatch.setattr(nvml, name, value)
    return fake
