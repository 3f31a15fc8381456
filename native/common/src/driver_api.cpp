#include "mneme/common/driver_api.hpp"

#include <dlfcn.h>

#include <mutex>

#include "mneme/common/interpose.hpp"

namespace mneme::common {
namespace {

template <typename F>
void bind(void* h, F& slot, const char* name) {
  slot = reinterpret_cast<F>(real_dlsym(h, name));
}

thread_local bool t_loading = false;

}  // namespace

bool driver_loading() { return t_loading; }

DriverApi& driver() {
  static DriverApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    t_loading = true;
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    t_loading = false;
    if (!h) return;
    api.handle = h;
#define MNEME_BIND(name) bind(h, api.name, #name)
    MNEME_BIND(cuGetProcAddress_v2);
    MNEME_BIND(cuMemAlloc_v2);
    MNEME_BIND(cuMemAllocPitch_v2);
    MNEME_BIND(cuMemFree_v2);
    MNEME_BIND(cuMemGetAddressRange_v2);
    MNEME_BIND(cuMemAllocAsync);
    MNEME_BIND(cuMemAllocFromPoolAsync);
    MNEME_BIND(cuMemFreeAsync);
    MNEME_BIND(cuStreamSynchronize);
    MNEME_BIND(cuCtxGetDevice);
    MNEME_BIND(cuCtxGetCurrent);
    MNEME_BIND(cuCtxSynchronize);
    MNEME_BIND(cuDeviceGetAttribute);
    MNEME_BIND(cuDeviceGetName);
    MNEME_BIND(cuMemAddressReserve);
    MNEME_BIND(cuMemAddressFree);
    MNEME_BIND(cuMemCreate);
    MNEME_BIND(cuMemMap);
    MNEME_BIND(cuMemRelease);
    MNEME_BIND(cuMemSetAccess);
    MNEME_BIND(cuMemGetAllocationGranularity);
    MNEME_BIND(cuMemAllocHost_v2);
    MNEME_BIND(cuMemFreeHost);
    MNEME_BIND(cuMemHostRegister_v2);
    MNEME_BIND(cuMemcpyDtoHAsync_v2);
    MNEME_BIND(cuStreamCreate);
    MNEME_BIND(cuEventCreate);
    MNEME_BIND(cuEventRecord);
    MNEME_BIND(cuEventSynchronize);
    MNEME_BIND(cuFuncGetParamInfo);
    MNEME_BIND(cuKernelGetParamInfo);
    MNEME_BIND(cuKernelGetFunction);
    MNEME_BIND(cuFuncGetName);
    MNEME_BIND(cuFuncGetModule);
    MNEME_BIND(cuFuncLoad);
    MNEME_BIND(cuKernelGetLibrary);
    MNEME_BIND(cuKernelGetName);
    MNEME_BIND(cuModuleGetGlobal_v2);
    MNEME_BIND(cuGetErrorString);
    MNEME_BIND(cuStreamIsCapturing);
    MNEME_BIND(cuMemPrefetchAsync_v2);
    MNEME_BIND(cuModuleLoadData);
    MNEME_BIND(cuModuleGetFunction);
    MNEME_BIND(cuLaunchKernel);
    MNEME_BIND(cuMemcpyHtoDAsync_v2);
    MNEME_BIND(cuLaunchKernel_ptsz);
    MNEME_BIND(cuLaunchKernelEx);
    MNEME_BIND(cuLaunchKernelEx_ptsz);
    MNEME_BIND(cuMemcpyDtoDAsync_v2);
    MNEME_BIND(cuFuncSetAttribute);
    MNEME_BIND(cuDriverGetVersion);
    MNEME_BIND(cuGraphLaunch);
    MNEME_BIND(cuGraphLaunch_ptsz);
    MNEME_BIND(cuGraphClone);
    MNEME_BIND(cuGraphDestroy);
    MNEME_BIND(cuGraphGetNodes);
    MNEME_BIND(cuGraphGetEdges_v2);
    bind(h, api.cuGraphGetEdges_v1, "cuGraphGetEdges");
    MNEME_BIND(cuGraphNodeGetType);
    MNEME_BIND(cuGraphKernelNodeGetParams_v2);
    MNEME_BIND(cuGraphKernelNodeGetAttribute);
    MNEME_BIND(cuGraphMemsetNodeGetParams);
    MNEME_BIND(cuGraphMemcpyNodeGetParams);
    MNEME_BIND(cuGraphHostNodeGetParams);
    MNEME_BIND(cuGraphChildGraphNodeGetGraph);
    MNEME_BIND(cuGraphEventRecordNodeGetEvent);
    MNEME_BIND(cuGraphEventWaitNodeGetEvent);
    MNEME_BIND(cuFuncGetAttribute);
    MNEME_BIND(cuMemsetD8Async);
    MNEME_BIND(cuMemsetD16Async);
    MNEME_BIND(cuMemsetD32Async);
    MNEME_BIND(cuMemsetD2D8Async);
    MNEME_BIND(cuMemsetD2D16Async);
    MNEME_BIND(cuMemsetD2D32Async);
    MNEME_BIND(cuMemcpy3DAsync_v2);
    MNEME_BIND(cuArray3DGetDescriptor_v2);
    MNEME_BIND(cuLaunchHostFunc);
    MNEME_BIND(cuStreamWaitEvent);
#undef MNEME_BIND
    api.loaded = api.cuMemAlloc_v2 && api.cuMemAddressReserve && api.cuMemCreate;
  });
  return api;
}

const char* error_string(CUresult r) {
  const char* s = nullptr;
  if (driver().cuGetErrorString) driver().cuGetErrorString(r, &s);
  return s ? s : "unknown CUDA error";
}

}  // namespace mneme::common
