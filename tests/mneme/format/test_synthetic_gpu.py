"""On a GPU: the synthetic vector-add recording replays to exactly its epilogue.

This checks the promise of ``mneme.testing.synthetic`` that other components'
tests rely on (real code, consistent memory), with the driver API through
ctypes only, independent of mneme's replay engine. The buffers are allocated
wherever the driver puts them and the pointer arguments are relocated through
``pointer_args``, which also checks that field's meaning.
"""

from __future__ import annotations

import ctypes
import struct

import pytest

from mneme.recording.execution import RecordedExecution
from mneme.testing.synthetic import write_vecadd_recording

pytestmark = pytest.mark.gpu

_u64 = ctypes.c_uint64
_p = ctypes.c_void_p
_u = ctypes.c_uint


def _driver():
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuInit.argtypes = [_u]
    cuda.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    cuda.cuDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
    cuda.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(_p), ctypes.c_int]
    cuda.cuDevicePrimaryCtxRelease_v2.argtypes = [ctypes.c_int]
    cuda.cuCtxSetCurrent.argtypes = [_p]
    cuda.cuModuleLoadData.argtypes = [ctypes.POINTER(_p), ctypes.c_char_p]
    cuda.cuModuleGetFunction.argtypes = [ctypes.POINTER(_p), _p, ctypes.c_char_p]
    cuda.cuModuleUnload.argtypes = [_p]
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(_u64), ctypes.c_size_t]
    cuda.cuMemFree_v2.argtypes = [_u64]
    cuda.cuMemcpyHtoD_v2.argtypes = [_u64, ctypes.c_char_p, ctypes.c_size_t]
    cuda.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, _u64, ctypes.c_size_t]
    cuda.cuLaunchKernel.argtypes = [_p, _u, _u, _u, _u, _u, _u, _u, _p, ctypes.POINTER(_p), ctypes.POINTER(_p)]
    cuda.cuCtxSynchronize.argtypes = []
    cuda.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return cuda


def _check(cuda, rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(rc, ctypes.byref(name))
        raise AssertionError(f"{what} failed: {rc} ({name.value})")


@pytest.mark.parametrize("code_kind", ["cubin", "ptx"])
def test_synthetic_vecadd_replays_to_its_epilogue(tmp_path, code_kind):
    made = write_vecadd_recording(tmp_path, n=5000, block=128, seed=7)
    rec = RecordedExecution.from_json(made.path)
    kernel = rec.single_instance()
    cuda = _driver()
    _check(cuda, cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    _check(cuda, cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    major, minor = ctypes.c_int(), ctypes.c_int()
    cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)
    if code_kind == "cubin" and (major.value, minor.value) != rec.device.compute_capability:
        pytest.skip(f"the synthetic cubin is {rec.code.arch}; this GPU is sm_{major.value}{minor.value}")
    ctx = _p()
    _check(cuda, cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    allocations: list[int] = []
    module = _p()
    try:
        _check(cuda, cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        image = kernel.load_code(code_kind) + (b"\0" if code_kind == "ptx" else b"")
        _check(cuda, cuda.cuModuleLoadData(ctypes.byref(module), image), "cuModuleLoadData")
        func = _p()
        _check(cuda, cuda.cuModuleGetFunction(ctypes.byref(func), module, kernel.kernel_name.encode()), "get function")

        prologue, epilogue = kernel.load_prologue(), kernel.load_epilogue()
        placed: dict[int, tuple[int, int]] = {}  # recorded base -> (device address, size)
        for region in prologue.regions:
            ptr = _u64()
            _check(cuda, cuda.cuMemAlloc_v2(ctypes.byref(ptr), region.size), "cuMemAlloc")
            allocations.append(ptr.value)
            _check(cuda, cuda.cuMemcpyHtoD_v2(ptr, region.read(rec.store), region.size), "copy in")
            placed[region.base] = (ptr.value, region.size)

        args = bytearray(kernel.arguments)
        for offset in kernel.pointer_args:
            (recorded,) = struct.unpack_from("<Q", args, offset)
            base = next(b for b, (_, size) in placed.items() if b <= recorded < b + size)
            struct.pack_into("<Q", args, offset, placed[base][0] + recorded - base)
        arg_buffer = (ctypes.c_char * len(args)).from_buffer(args)
        params = (_p * len(kernel.signature.params))(
            *[ctypes.addressof(arg_buffer) + p.offset for p in kernel.signature.params]
        )
        g, b = kernel.grid_dim, kernel.block_dim
        _check(
            cuda,
            cuda.cuLaunchKernel(func, g.x, g.y, g.z, b.x, b.y, b.z, kernel.shared_mem, None, params, None),
            "cuLaunchKernel",
        )
        _check(cuda, cuda.cuCtxSynchronize(), "cuCtxSynchronize")

        for region in epilogue.regions:
            out = ctypes.create_string_buffer(region.size)
            _check(cuda, cuda.cuMemcpyDtoH_v2(out, placed[region.base][0], region.size), "copy out")
            assert out.raw == region.read(rec.store), f"region {region.name} differs from the epilogue"
    finally:
        for ptr in allocations:
            cuda.cuMemFree_v2(ptr)
        if module.value:
            cuda.cuModuleUnload(module)
        cuda.cuDevicePrimaryCtxRelease_v2(dev)
