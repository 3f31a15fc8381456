// Launch interposition for unmodified programs, the way the recorder
// redirects allocations: the apply library's launch functions, handed out by
// native/common's dlsym and cuGetProcAddress wrapper
// (mneme/common/interpose.hpp) and exported under the driver's names for
// programs linked against libcuda directly.
#include <cstring>

#include "mneme/common/driver_api.hpp"
#include "mneme/common/interpose.hpp"

#include "applier.hpp"

using mneme::apply::LaunchCall;
using namespace mneme::common;

namespace {

bool applying() { return mneme::apply::active() && driver().cuLaunchKernel; }

LaunchCall plain_call(bool ptsz, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                      unsigned bz, unsigned shared, CUstream stream, void** params, void** extra) {
  LaunchCall c;
  c.per_thread_stream = ptsz;
  c.f = f;
  c.grid[0] = gx, c.grid[1] = gy, c.grid[2] = gz;
  c.block[0] = bx, c.block[1] = by, c.block[2] = bz;
  c.shared_mem = shared;
  c.stream = stream;
  c.params = params;
  c.extra = extra;
  return c;
}

LaunchCall ex_call(bool ptsz, const CUlaunchConfig* cfg, CUfunction f, void** params, void** extra) {
  LaunchCall c = plain_call(ptsz, f, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ, cfg->blockDimX, cfg->blockDimY,
                            cfg->blockDimZ, cfg->sharedMemBytes, cfg->hStream, params, extra);
  c.ex = cfg;
  return c;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                                unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                                                CUstream stream, void** params, void** extra) {
  return mneme::apply::launch(plain_call(false, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra));
}

__attribute__((visibility("default"))) CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                                                     unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                                                     unsigned shared, CUstream stream, void** params,
                                                                     void** extra) {
  return mneme::apply::launch(plain_call(true, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra));
}

__attribute__((visibility("default"))) CUresult cuLaunchKernelEx(const CUlaunchConfig* cfg, CUfunction f,
                                                                  void** params, void** extra) {
  if (!cfg) return driver().cuLaunchKernelEx ? driver().cuLaunchKernelEx(cfg, f, params, extra) : CUDA_ERROR_INVALID_VALUE;
  return mneme::apply::launch(ex_call(false, cfg, f, params, extra));
}

__attribute__((visibility("default"))) CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* cfg, CUfunction f,
                                                                       void** params, void** extra) {
  if (!cfg)
    return driver().cuLaunchKernelEx_ptsz ? driver().cuLaunchKernelEx_ptsz(cfg, f, params, extra)
                                          : CUDA_ERROR_INVALID_VALUE;
  return mneme::apply::launch(ex_call(true, cfg, f, params, extra));
}

}  // extern "C"

// What native/common's interposition asks the apply library (mneme/common/interpose.hpp).
namespace mneme::common::interposer {

bool watches_dlsym() { return applying(); }

bool replaces_proc_addresses() { return applying(); }

// The launch entry points (either stream flavour).
void replace_proc_address(const char* symbol, void** pfn, int, cuuint64_t flags) {
  auto& d = driver();
  // Which stream flavour the caller got: the pointer says, else the flags it asked with.
  bool ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  if (std::strcmp(symbol, "cuLaunchKernel") == 0) {
    if (*pfn == reinterpret_cast<void*>(d.cuLaunchKernel)) ptsz = false;
    else if (*pfn == reinterpret_cast<void*>(d.cuLaunchKernel_ptsz)) ptsz = true;
    *pfn = ptsz ? reinterpret_cast<void*>(&cuLaunchKernel_ptsz) : reinterpret_cast<void*>(&cuLaunchKernel);
  } else if (std::strcmp(symbol, "cuLaunchKernelEx") == 0) {
    if (*pfn == reinterpret_cast<void*>(d.cuLaunchKernelEx)) ptsz = false;
    else if (*pfn == reinterpret_cast<void*>(d.cuLaunchKernelEx_ptsz)) ptsz = true;
    *pfn = ptsz ? reinterpret_cast<void*>(&cuLaunchKernelEx_ptsz) : reinterpret_cast<void*>(&cuLaunchKernelEx);
  }
}

// The driver's launch functions under whichever name dlsym found them.
void* replace_symbol(const char*, void* p) {
  auto& d = driver();
  if (p == reinterpret_cast<void*>(d.cuLaunchKernel)) return reinterpret_cast<void*>(&cuLaunchKernel);
  if (p == reinterpret_cast<void*>(d.cuLaunchKernel_ptsz)) return reinterpret_cast<void*>(&cuLaunchKernel_ptsz);
  if (p == reinterpret_cast<void*>(d.cuLaunchKernelEx)) return reinterpret_cast<void*>(&cuLaunchKernelEx);
  if (p == reinterpret_cast<void*>(d.cuLaunchKernelEx_ptsz)) return reinterpret_cast<void*>(&cuLaunchKernelEx_ptsz);
  return p;
}

}  // namespace mneme::common::interposer
