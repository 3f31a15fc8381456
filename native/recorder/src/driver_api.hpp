// The CUDA driver entry points the recorder itself calls, resolved at run time
// from libcuda.so.1 (no link-time dependency: the library builds on machines
// without a driver and is inert when none is present).
#pragma once
#include <cuda.h>

namespace mneme::rec {

struct DriverApi {
  bool loaded = false;
  void* handle = nullptr;
  CUresult (*cuGetProcAddress_v2)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*) = nullptr;
  CUresult (*cuMemAlloc_v2)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*cuMemAllocPitch_v2)(CUdeviceptr*, size_t*, size_t, size_t, unsigned int) = nullptr;
  CUresult (*cuMemFree_v2)(CUdeviceptr) = nullptr;
  CUresult (*cuMemGetAddressRange_v2)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
  CUresult (*cuMemAllocAsync)(CUdeviceptr*, size_t, CUstream) = nullptr;
  CUresult (*cuMemAllocFromPoolAsync)(CUdeviceptr*, size_t, CUmemoryPool, CUstream) = nullptr;
  CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuCtxGetDevice)(CUdevice*) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxSynchronize)() = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuMemAddressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*cuMemAddressFree)(CUdeviceptr, size_t) = nullptr;
  CUresult (*cuMemCreate)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*cuMemGetAllocationGranularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*cuMemAllocHost_v2)(void**, size_t) = nullptr;
  CUresult (*cuMemFreeHost)(void*) = nullptr;
  CUresult (*cuMemHostRegister_v2)(void*, size_t, unsigned int) = nullptr;
  CUresult (*cuMemcpyDtoHAsync_v2)(void*, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*cuStreamCreate)(CUstream*, unsigned int) = nullptr;
  CUresult (*cuEventCreate)(CUevent*, unsigned int) = nullptr;
  CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent) = nullptr;
  CUresult (*cuFuncGetParamInfo)(CUfunction, size_t, size_t*, size_t*) = nullptr;
  CUresult (*cuKernelGetParamInfo)(CUkernel, size_t, size_t*, size_t*) = nullptr;
  CUresult (*cuKernelGetFunction)(CUfunction*, CUkernel) = nullptr;
  CUresult (*cuFuncGetName)(const char**, CUfunction) = nullptr;
  CUresult (*cuFuncGetModule)(CUmodule*, CUfunction) = nullptr;
  // Lazy module loading (code_images.cpp): CUDA 12.4+, null on older drivers.
  CUresult (*cuFuncLoad)(CUfunction) = nullptr;
  CUresult (*cuKernelGetLibrary)(CUlibrary*, CUkernel) = nullptr;
  CUresult (*cuKernelGetName)(const char**, CUkernel) = nullptr;
  CUresult (*cuModuleGetGlobal_v2)(CUdeviceptr*, size_t*, CUmodule, const char*) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus*) = nullptr;
  CUresult (*cuMemPrefetchAsync_v2)(CUdeviceptr, size_t, CUmemLocation, unsigned int, CUstream) = nullptr;  // 12.2+
  // The snapshot digest kernel (gpu_digest.cpp).
  CUresult (*cuModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                             void**, void**) = nullptr;
  CUresult (*cuMemcpyHtoDAsync_v2)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;
  // The apply library (native/apply): launching tuned code, checking it.
  CUresult (*cuLaunchKernel_ptsz)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  CUstream, void**, void**) = nullptr;
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**) = nullptr;
  CUresult (*cuLaunchKernelEx_ptsz)(const CUlaunchConfig*, CUfunction, void**, void**) = nullptr;
  CUresult (*cuMemcpyDtoDAsync_v2)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*cuFuncSetAttribute)(CUfunction, CUfunction_attribute, int) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
};

// True on the thread that is loading libcuda right now (our dlsym must then
// only forward: the driver's own look-ups happen inside that load).
bool driver_loading();

// Resolves the table once (thread-safe); returns it even when loading failed
// (check `loaded`).
DriverApi& driver();

// The real dlsym of the C library (our exported `dlsym` shadows it).
using DlsymFn = void* (*)(void*, const char*);
DlsymFn real_dlsym_function();
void* real_dlsym(void* handle, const char* name);

const char* error_string(CUresult r);

}  // namespace mneme::rec
