"""The NVML module against a fake ``pynvml``: conditions, clock-event reasons, the energy counter, clock
locks, and the paths where NVML cannot say (each said once, never a zero)."""

from __future__ import annotations

import logging
import sys

import pytest

from mneme._internal import nvml
from mneme.errors import NotAvailableError
from mneme.testing.fake_nvml import PCI_BUS_ID, FakeNvml, install


@pytest.fixture
def fake(monkeypatch) -> FakeNvml:
    return install(monkeypatch)


def test_nvml_is_initialized_once_and_finds_the_cuda_device_by_its_pci_bus_id(fake):
    device = nvml.cuda_device(0)
    assert device.pci_bus_id == PCI_BUS_ID and nvml.cuda_device(0) is device
    assert fake.called("nvmlInit") == [()] and fake.called("nvmlDeviceGetHandleByPciBusId") == [(PCI_BUS_ID,)]
    assert nvml.unavailable_reason() == ""


def test_conditions_read_clocks_temperature_power_and_reasons(fake):
    fake.reasons = 0x4 | 0x20 | 0x1
    reading = nvml.cuda_device().conditions()
    assert reading == {"sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "temperature_c": 41, "power_w": 123.456,
                       "clock_event_reasons": ["gpu_idle", "sw_power_cap", "sw_thermal_slowdown"]}
    assert nvml.throttling(reading["clock_event_reasons"]) == ["sw_power_cap", "sw_thermal_slowdown"]


def test_a_value_nvml_does_not_give_is_absent_not_zero(fake):
    fake.fail["nvmlDeviceGetPowerUsage"] = 3  # NOT_SUPPORTED
    fake.fail["nvmlDeviceGetTemperature"] = 3
    reading = nvml.cuda_device().conditions()
    assert "power_w" not in reading and "temperature_c" not in reading and reading["sm_clock_mhz"] == 1980


@pytest.mark.parametrize("mask, names", [
    (0, []),
    (0x1, ["gpu_idle"]),
    (0x2 | 0x8 | 0x40 | 0x80, ["applications_clocks_setting", "hw_slowdown", "hw_thermal_slowdown",
                               "hw_power_brake_slowdown"]),
    (0x10 | 0x100 | 0x200 | 0x400, ["sync_boost", "display_clock_setting", "board_limit", "reliability"]),
    (0x1 | 0x10000, ["gpu_idle", "0x10000"]),
])
def test_reasons_are_decoded_by_name(mask, names):
    assert nvml.decode_reasons(mask) == names


def test_idle_locked_clocks_and_sync_boost_are_not_throttling():
    assert nvml.throttling(["gpu_idle", "applications_clocks_setting", "sync_boost", "display_clock_setting"]) == []
    assert nvml.throttling(["hw_slowdown", "gpu_idle", "board_limit"]) == ["hw_slowdown", "board_limit"]


def test_an_older_pynvml_without_clocks_event_reasons_uses_the_throttle_reasons(fake, monkeypatch):
    monkeypatch.setattr(FakeNvml, "nvmlDeviceGetCurrentClocksEventReasons", None, raising=False)
    fake.nvmlDeviceGetCurrentClocksThrottleReasons = lambda handle: 0x4
    assert nvml.cuda_device().conditions()["clock_event_reasons"] == ["sw_power_cap"]


def test_the_energy_counter_is_read_in_millijoules(fake):
    device = nvml.cuda_device()
    assert device.energy_mj() >= fake.energy_base_mj and device.energy_unavailable_reason() == ""


def test_a_gpu_without_an_energy_counter_says_why(fake):
    fake.fail["nvmlDeviceGetTotalEnergyConsumption"] = 3
    device = nvml.cuda_device()
    with pytest.raises(NotAvailableError, match="no energy counter"):
        device.energy_mj()
    assert "Not Supported (NVML error 3)" in device.energy_unavailable_reason()
    calls = len(fake.called("nvmlDeviceGetTotalEnergyConsumption"))
    device.energy_unavailable_reason()
    assert len(fake.called("nvmlDeviceGetTotalEnergyConsumption")) == calls  # asked once


def test_without_the_nvml_library_every_use_says_why(monkeypatch):
    fake = install(monkeypatch)
    fake.fail["nvmlInit"] = 12  # what nvidia-ml-py raises on a machine without the driver's libnvidia-ml.so
    reason = nvml.unavailable_reason()
    assert reason == "NVML did not initialize: NVML Shared Library Not Found (NVML error 12)"
    with pytest.raises(NotAvailableError, match="NVML Shared Library Not Found"):
        nvml.cuda_device(0)
    assert len(fake.called("nvmlInit")) == 1  # tried once per process


def test_without_nvidia_ml_py_the_reason_says_what_to_install(monkeypatch):
    install(monkeypatch)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert nvml.unavailable_reason() == "nvidia-ml-py is not installed (pip install nvidia-ml-py)"


def test_the_real_nvidia_ml_py_without_a_gpu_fails_cleanly(monkeypatch):
    """On this machine (no GPU) the installed nvidia-ml-py's nvmlInit fails: the reason names it."""
    pytest.importorskip("pynvml")
    for name, value in (("_pynvml", None), ("_init_error", None), ("_devices", {}), ("_said", set())):
        monkeypatch.setattr(nvml, name, value)
    from mneme.testing.gpu import gpu_unavailable_reason

    if gpu_unavailable_reason() is None:
        pytest.skip("a GPU is here: NVML initializes")
    assert nvml.unavailable_reason().startswith("NVML did not initialize: ")


def test_a_cuda_device_the_driver_cannot_name_is_not_available(monkeypatch):
    install(monkeypatch, bus_id=None)
    with pytest.raises(NotAvailableError, match="PCI bus id"):
        nvml.cuda_device(0)


def test_a_gpu_nvml_does_not_know_is_not_available(monkeypatch):
    install(monkeypatch, bus_id="00000000:99:00.0")
    with pytest.raises(NotAvailableError, match="00000000:99:00.0.*Not Found"):
        nvml.cuda_device(0)


def test_say_once_says_a_message_once(fake, caplog):
    with caplog.at_level(logging.WARNING, logger="mneme.nvml"):
        assert nvml.say_once("energy is not measured: x")
        assert not nvml.say_once("energy is not measured: x")
        assert nvml.say_once("another")
    assert [r.getMessage() for r in caplog.records] == ["energy is not measured: x", "another"]


def test_max_lock_sets_and_restores_sm_and_memory_clocks(fake):
    lock = nvml.ClockLock(nvml.cuda_device(), "max")
    assert lock.apply() == ""
    assert lock.locked == {"sm_clock_mhz": 1980, "mem_clock_mhz": 2619}
    handle = f"handle:{PCI_BUS_ID}"
    assert fake.called("nvmlDeviceSetGpuLockedClocks") == [(handle, 1980, 1980)]
    assert fake.called("nvmlDeviceSetMemoryLockedClocks") == [(handle, 2619, 2619)]
    lock.restore()
    lock.restore()  # once
    assert fake.called("nvmlDeviceResetGpuLockedClocks") == [(handle,)]
    assert fake.called("nvmlDeviceResetMemoryLockedClocks") == [(handle,)]


def test_base_lock_uses_the_tdp_clock_and_the_default_memory_clock(fake):
    fake.default_mem_clock = 1593
    lock = nvml.ClockLock(nvml.cuda_device(), "base")
    assert lock.apply() == ""
    tdp = nvml.CLOCK_LIMIT_ID_TDP
    assert fake.called("nvmlDeviceSetGpuLockedClocks") == [(f"handle:{PCI_BUS_ID}", tdp, tdp)]
    assert fake.called("nvmlDeviceSetMemoryLockedClocks")[0][1:] == (1593, 1593)
    assert lock.locked == {"sm_clock_mhz": "base", "mem_clock_mhz": 1593}


def test_a_lock_not_permitted_says_so_once_and_changes_nothing(fake, caplog):
    fake.fail["nvmlDeviceSetGpuLockedClocks"] = 4  # NO_PERMISSION: not root, or a virtualized GPU
    with caplog.at_level(logging.WARNING, logger="mneme.nvml"):
        problems = [nvml.ClockLock(nvml.cuda_device(), "max").apply() for _ in range(2)]
    assert problems[0] == problems[1] and "not permitted" in problems[0] and "Insufficient Permissions" in problems[0]
    assert len([r for r in caplog.records if "not permitted" in r.getMessage()]) == 1
    lock = nvml.ClockLock(nvml.cuda_device(), "max")
    lock.apply()
    lock.restore()
    assert not lock.locked and fake.called("nvmlDeviceResetGpuLockedClocks") == []  # nothing to put back


def test_a_gpu_whose_memory_clock_cannot_be_locked_keeps_the_sm_lock(fake):
    fake.fail["nvmlDeviceSetMemoryLockedClocks"] = 3
    lock = nvml.ClockLock(nvml.cuda_device(), "max")
    problem = lock.apply()
    assert "memory clock is not locked" in problem and "not supported" in problem
    assert lock.locked == {"sm_clock_mhz": 1980}
    lock.restore()
    assert len(fake.called("nvmlDeviceResetGpuLockedClocks")) == 1 and not fake.called("nvmlDeviceResetMemoryLockedClocks")


def test_power_limits_and_max_clocks(fake):
    device = nvml.cuda_device()
    assert device.power_limits_w() == (200.0, 700.0) and device.max_clocks_mhz() == (1980, 2619)


def test_the_cost_bench_prints_its_table(fake, capsys):
    import nvml_cost  # bench/nvml_cost.py (pytest puts bench/ on the path)

    assert nvml_cost.main(["--reps", "3", "--counter-seconds", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "| conditions() (the five reads above) |" in out and "Measurer before+after" in out
    assert "energy counter, GPU idle" in out and "between steps" in out


def test_the_cost_bench_says_why_without_nvml(monkeypatch, capsys):
    import nvml_cost

    install(monkeypatch).fail["nvmlInit"] = 12
    assert nvml_cost.main(["--reps", "1"]) == 2
    assert "NVML Shared Library Not Found" in capsys.readouterr().err
