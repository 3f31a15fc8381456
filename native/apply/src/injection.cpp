// Entry point the CUDA driver calls when CUDA_INJECTION64_PATH names this
// library: subscribes to CUPTI's module-loaded callback only, so the apply
// library can check that a kernel's loaded code is the code that was tuned
// (launches themselves come through interpose.cpp, not CUPTI).
#include <cupti.h>
#include <dlfcn.h>

#include <cstdio>
#include <string>

#include "mneme/common/cupti_loader.hpp"

#include "applier.hpp"

namespace {

using SubscribeFn = CUptiResult (*)(CUpti_SubscriberHandle*, CUpti_CallbackFunc, void*);
using EnableCallbackFn = CUptiResult (*)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId);

void CUPTIAPI on_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  if (domain != CUPTI_CB_DOMAIN_RESOURCE || cbid != CUPTI_CBID_RESOURCE_MODULE_LOADED) return;
  auto* rd = static_cast<const CUpti_ResourceData*>(data);
  auto* md = static_cast<const CUpti_ModuleResourceData*>(rd->resourceDescriptor);
  if (md) mneme::apply::on_module_loaded(md->pCubin, md->cubinSize);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  static bool done = false;
  if (done || !mneme::apply::active()) return 1;
  done = true;
  std::string path;
  void* h = mneme::common::open_cupti(&path);
  auto subscribe = h ? reinterpret_cast<SubscribeFn>(dlsym(h, "cuptiSubscribe")) : nullptr;
  auto enable = h ? reinterpret_cast<EnableCallbackFn>(dlsym(h, "cuptiEnableCallback")) : nullptr;
  CUpti_SubscriberHandle sub;
  if (!subscribe || !enable || subscribe(&sub, on_callback, nullptr) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "mneme apply: warning: cannot load CUPTI (set MNEME_CUPTI_PATH) or subscribe to it; kernels'"
                         " code cannot be checked, so nothing is applied\n");
    return 0;
  }
  enable(1, sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED);
  return 1;
}
