"""What the driver says about the worker's GPU (ctypes over libcuda.so.1).

Used by workers to report the compute capability the compile pool targets and
the memory the prepared-instance cache may use, and by the NVML module to find
a CUDA device's GPU (its PCI bus id); no GPU work, no context.
"""

from __future__ import annotations

import ctypes

_ATTR_CC_MAJOR = 75
_ATTR_CC_MINOR = 76


def query_device(device: int = 0) -> dict:
    """{'name', 'arch' ('sm_90'), 'total_memory'}; raises OSError/RuntimeError without a driver."""
    cuda = ctypes.CDLL("libcuda.so.1")
    _check(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    _check(cuda.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(cuda.cuDeviceGetAttribute(ctypes.byref(major), _ATTR_CC_MAJOR, dev), "cuDeviceGetAttribute")
    _check(cuda.cuDeviceGetAttribute(ctypes.byref(minor), _ATTR_CC_MINOR, dev), "cuDeviceGetAttribute")
    name = ctypes.create_string_buffer(256)
    _check(cuda.cuDeviceGetName(name, 256, dev), "cuDeviceGetName")
    total = ctypes.c_size_t()
    _check(cuda.cuDeviceTotalMem_v2(ctypes.byref(total), dev), "cuDeviceTotalMem_v2")
    return {
        "name": name.value.decode(errors="replace"),
        "arch": f"sm_{major.value}{minor.value}",
        "total_memory": int(total.value),
    }


def pci_bus_id(device: int = 0) -> str:
    """The PCI bus id of CUDA device ``device`` as this process sees it (``CUDA_VISIBLE_DEVICES`` applied),
    e.g. ``0000:3B:00.0``: what NVML finds the same GPU by (NVML's indices are not CUDA's).

    Args:
        device: the CUDA device ordinal.

    Returns:
        The bus id.

    Raises:
        OSError: no driver.
        RuntimeError: the driver failed (no such device).
    """
    cuda = ctypes.CDLL("libcuda.so.1")
    _check(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    _check(cuda.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    bus = ctypes.create_string_buffer(64)
    _check(cuda.cuDeviceGetPCIBusId(bus, 64, dev), "cuDeviceGetPCIBusId")
    return bus.value.decode()


def visible_gpu_count() -> int:
    """GPUs this process can use (0 without a driver)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    if cuda.cuInit(0) != 0:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} failed with CUDA error {rc}")
