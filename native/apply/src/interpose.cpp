// Launch interposition for unmodified programs, the way the recorder
// redirects allocations (native/recorder/src/interpose.cpp, design.md section
// 4): cudart reaches the driver through dlsym(handle, "cuGetProcAddress_v2")
// and asks that function for every entry point; our dlsym hands out a wrapper
// of cuGetProcAddress that hands out our launch functions. Programs linked
// against libcuda directly get the same functions by symbol interposition.
#include <dlfcn.h>

#include <atomic>
#include <cstring>

#include "mneme/common/driver_api.hpp"

#include "applier.hpp"

using mneme::apply::LaunchCall;
using namespace mneme::common;

namespace {

using GpaV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
std::atomic<GpaV1> g_real_gpa_v1{nullptr};

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

static CUresult mneme_gpa_v2(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
static CUresult mneme_gpa_v1(const char*, void**, int, cuuint64_t);

// Replaces the driver's answer for the launch entry points (either stream flavour).
static void substitute(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  if (!pfn || !*pfn || !applying()) return;
  auto& d = driver();
  if (std::strcmp(symbol, "cuGetProcAddress") == 0) {
    if (version >= 12000) {
      *pfn = reinterpret_cast<void*>(&mneme_gpa_v2);
    } else {
      g_real_gpa_v1.store(reinterpret_cast<GpaV1>(*pfn));
      *pfn = reinterpret_cast<void*>(&mneme_gpa_v1);
    }
    return;
  }
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

static CUresult mneme_gpa_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* status) {
  auto real = driver().cuGetProcAddress_v2;
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && symbol) substitute(symbol, pfn, version, flags);
  return r;
}

static CUresult mneme_gpa_v1(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  GpaV1 real = g_real_gpa_v1.load();
  if (!real) return mneme_gpa_v2(symbol, pfn, version, flags, nullptr);
  CUresult r = real(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS && symbol) substitute(symbol, pfn, version, flags);
  return r;
}

__attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                                                     cuuint64_t flags,
                                                                     CUdriverProcAddressQueryResult* status) {
  return mneme_gpa_v2(symbol, pfn, version, flags, status);
}

static void* substitute_cuda_symbol(void* handle, const char* name) {
  void* p = real_dlsym(handle, name);
  if (!p) return p;
  auto& d = driver();
  if (std::strcmp(name, "cuGetProcAddress_v2") == 0) {
    if (p == reinterpret_cast<void*>(d.cuGetProcAddress_v2)) return reinterpret_cast<void*>(&mneme_gpa_v2);
  } else if (std::strcmp(name, "cuGetProcAddress") == 0) {
    if (d.handle && p == real_dlsym(d.handle, "cuGetProcAddress")) {
      g_real_gpa_v1.store(reinterpret_cast<GpaV1>(p));
      return reinterpret_cast<void*>(&mneme_gpa_v1);
    }
  } else if (p == reinterpret_cast<void*>(d.cuLaunchKernel)) {
    return reinterpret_cast<void*>(&cuLaunchKernel);
  } else if (p == reinterpret_cast<void*>(d.cuLaunchKernel_ptsz)) {
    return reinterpret_cast<void*>(&cuLaunchKernel_ptsz);
  } else if (p == reinterpret_cast<void*>(d.cuLaunchKernelEx)) {
    return reinterpret_cast<void*>(&cuLaunchKernelEx);
  } else if (p == reinterpret_cast<void*>(d.cuLaunchKernelEx_ptsz)) {
    return reinterpret_cast<void*>(&cuLaunchKernelEx_ptsz);
  }
  return p;
}

// Shadows the C library's dlsym for the whole process (we are preloaded);
// everything but the driver's entry points goes to the real one through a
// sibling call, so RTLD_NEXT keeps its meaning for other libraries.
__attribute__((visibility("default"), optimize("O2", "optimize-sibling-calls"))) void* dlsym(void* handle,
                                                                                              const char* name) {
  if (name[0] == 'c' && name[1] == 'u' && handle != RTLD_NEXT && !driver_loading() && applying())
    return substitute_cuda_symbol(handle, name);
  return real_dlsym_function()(handle, name);
}

}  // extern "C"
