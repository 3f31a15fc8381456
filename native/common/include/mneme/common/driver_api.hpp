// The CUDA driver entry points the recorder and the apply library themselves
// call, resolved at run time from libcuda.so.1 (no link-time dependency: the
// libraries build on machines without a driver and are inert when none is
// present).
#pragma once
#include <cuda.h>

namespace mneme::common {

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
  // CUDA graphs (graph_expansion.cpp): reading a graph, running its nodes one by one.
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream) = nullptr;
  CUresult (*cuGraphLaunch_ptsz)(CUgraphExec, CUstream) = nullptr;
  CUresult (*cuGraphClone)(CUgraph*, CUgraph) = nullptr;
  CUresult (*cuGraphDestroy)(CUgraph) = nullptr;
  CUresult (*cuGraphGetNodes)(CUgraph, CUgraphNode*, size_t*) = nullptr;
  CUresult (*cuGraphGetEdges_v2)(CUgraph, CUgraphNode*, CUgraphNode*, CUgraphEdgeData*, size_t*) = nullptr;
  // "cuGraphGetEdges" of drivers before 12.3 (cuda.h's cuGraphGetEdges names the _v2)
  CUresult (*cuGraphGetEdges_v1)(CUgraph, CUgraphNode*, CUgraphNode*, size_t*) = nullptr;
  CUresult (*cuGraphNodeGetType)(CUgraphNode, CUgraphNodeType*) = nullptr;
  CUresult (*cuGraphKernelNodeGetParams_v2)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS*) = nullptr;
  CUresult (*cuGraphKernelNodeGetAttribute)(CUgraphNode, CUkernelNodeAttrID, CUkernelNodeAttrValue*) = nullptr;
  CUresult (*cuGraphMemsetNodeGetParams)(CUgraphNode, CUDA_MEMSET_NODE_PARAMS*) = nullptr;
  CUresult (*cuGraphMemcpyNodeGetParams)(CUgraphNode, CUDA_MEMCPY3D*) = nullptr;
  CUresult (*cuGraphHostNodeGetParams)(CUgraphNode, CUDA_HOST_NODE_PARAMS*) = nullptr;
  CUresult (*cuGraphChildGraphNodeGetGraph)(CUgraphNode, CUgraph*) = nullptr;
  CUresult (*cuGraphEventRecordNodeGetEvent)(CUgraphNode, CUevent*) = nullptr;
  CUresult (*cuGraphEventWaitNodeGetEvent)(CUgraphNode, CUevent*) = nullptr;
  CUresult (*cuFuncGetAttribute)(int*, CUfunction_attribute, CUfunction) = nullptr;
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream) = nullptr;
  CUresult (*cuMemsetD16Async)(CUdeviceptr, unsigned short, size_t, CUstream) = nullptr;
  CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream) = nullptr;
  CUresult (*cuMemsetD2D8Async)(CUdeviceptr, size_t, unsigned char, size_t, size_t, CUstream) = nullptr;
  CUresult (*cuMemsetD2D16Async)(CUdeviceptr, size_t, unsigned short, size_t, size_t, CUstream) = nullptr;
  CUresult (*cuMemsetD2D32Async)(CUdeviceptr, size_t, unsigned int, size_t, size_t, CUstream) = nullptr;
  CUresult (*cuMemcpy3DAsync_v2)(const CUDA_MEMCPY3D*, CUstream) = nullptr;
  // Texture and surface objects (the recorder's texture_objects.cpp): the CUDA arrays behind them.
  CUresult (*cuArray3DGetDescriptor_v2)(CUDA_ARRAY3D_DESCRIPTOR*, CUarray) = nullptr;
  CUresult (*cuLaunchHostFunc)(CUstream, CUhostFn, void*) = nullptr;
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned int) = nullptr;
};

// True on the thread that is loading libcuda right now (our dlsym must then
// only forward: the driver's own look-ups happen inside that load).
bool driver_loading();

// Resolves the table once (thread-safe); returns it even when loading failed
// (check `loaded`).
DriverApi& driver();

const char* error_string(CUresult r);

}  // namespace mneme::common
