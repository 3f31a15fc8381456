// Entry point the CUDA driver calls when CUDA_INJECTION64_PATH names this
// library: loads CUPTI (dlopen: no link-time dependency) and subscribes to
// the launch, module and resource callbacks the recorder needs.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mneme/common/cupti_loader.hpp"
#include "mneme/common/settings.hpp"

#include "graph_expansion.hpp"
#include "launch_recorder.hpp"

using namespace mneme::common;
using namespace mneme::rec;

namespace {

using SubscribeFn = CUptiResult (*)(CUpti_SubscriberHandle*, CUpti_CallbackFunc, void*);
using EnableCallbackFn = CUptiResult (*)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId);
using EnableDomainFn = CUptiResult (*)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain);

std::string g_cupti_path;
EnableCallbackFn g_enable_cb = nullptr;
CUpti_SubscriberHandle g_subscriber = nullptr;

const CUpti_CallbackId kLaunchIds[] = {
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
};

// Launch callbacks cost every launch of the application (CUPTI's dispatch
// plus ours): the recorder turns them on only while a loaded kernel may
// still be recorded (launch_recorder.cpp decides).
void switch_launch_callbacks(bool on) {
  for (auto id : kLaunchIds) g_enable_cb(on ? 1 : 0, g_subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  static bool done = false;
  if (done) return 1;
  done = true;
  if (!settings().active) return 1;
  void* h = open_cupti(&g_cupti_path);
  if (!h) {
    std::fprintf(stderr, "mneme record: error: cannot load libcupti (set MNEME_CUPTI_PATH to libcupti.so of your CUDA"
                         " toolkit); no kernel will be recorded\n");
    return 0;
  }
  auto subscribe = reinterpret_cast<SubscribeFn>(dlsym(h, "cuptiSubscribe"));
  auto enable_cb = reinterpret_cast<EnableCallbackFn>(dlsym(h, "cuptiEnableCallback"));
  auto enable_domain = reinterpret_cast<EnableDomainFn>(dlsym(h, "cuptiEnableDomain"));
  CUpti_SubscriberHandle sub;
  if (!subscribe || !enable_cb || !enable_domain || subscribe(&sub, on_callback, nullptr) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "mneme record: error: cannot subscribe to CUPTI callbacks (another profiler attached?); no"
                         " kernel will be recorded\n");
    return 0;
  }
  g_enable_cb = enable_cb;
  g_subscriber = sub;
  set_launch_callback_switch(switch_launch_callbacks);
  const CUpti_CallbackId driver_ids[] = {
      CUPTI_DRIVER_TRACE_CBID_cuModuleLoadData,
      CUPTI_DRIVER_TRACE_CBID_cuModuleLoadDataEx,
      CUPTI_DRIVER_TRACE_CBID_cuModuleLoadFatBinary,
      CUPTI_DRIVER_TRACE_CBID_cuLibraryLoadData,
      CUPTI_DRIVER_TRACE_CBID_cuTexObjectCreate,
      CUPTI_DRIVER_TRACE_CBID_cuTexObjectDestroy,
      CUPTI_DRIVER_TRACE_CBID_cuSurfObjectCreate,
      CUPTI_DRIVER_TRACE_CBID_cuSurfObjectDestroy,
      CUPTI_DRIVER_TRACE_CBID_cuArrayCreate_v2,
      CUPTI_DRIVER_TRACE_CBID_cuArray3DCreate_v2,
      CUPTI_DRIVER_TRACE_CBID_cuMipmappedArrayGetLevel,
      CUPTI_DRIVER_TRACE_CBID_cuArrayDestroy,
      CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged,
      CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc,
      CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2,
      CUPTI_DRIVER_TRACE_CBID_cuMemHostRegister_v2,
      CUPTI_DRIVER_TRACE_CBID_cuIpcOpenMemHandle_v2,
      CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost,
      CUPTI_DRIVER_TRACE_CBID_cuMemHostUnregister,
      CUPTI_DRIVER_TRACE_CBID_cuIpcCloseMemHandle,
      CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2,
  };
  for (auto id : driver_ids) enable_cb(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, id);
  for (auto id : graph_callback_ids()) enable_cb(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, id);
  enable_cb(1, sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED);
  if (settings().verbose)
    std::fprintf(stderr, "mneme record: %s subscribed; launch callbacks follow module loads\n", g_cupti_path.c_str());
  write_recorder_info(g_cupti_path.c_str());
  std::atexit(write_done_marker);
  return 1;
}
