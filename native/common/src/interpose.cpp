#include "mneme/common/interpose.hpp"

#include <dlfcn.h>

#include <atomic>
#include <cstring>

#include "mneme/common/driver_api.hpp"

using namespace mneme::common;

namespace {

using GpaV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
std::atomic<GpaV1> g_real_gpa_v1{nullptr};

CUresult mneme_gpa_v2(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
CUresult mneme_gpa_v1(const char*, void**, int, cuuint64_t);

// Replaces the driver's answer: cuGetProcAddress by our wrapper, the rest as the library says.
void substitute(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  if (!pfn || !*pfn || !interposer::replaces_proc_addresses()) return;
  if (std::strcmp(symbol, "cuGetProcAddress") == 0) {
    if (version >= 12000) {
      *pfn = reinterpret_cast<void*>(&mneme_gpa_v2);
    } else {
      g_real_gpa_v1.store(reinterpret_cast<GpaV1>(*pfn));
      *pfn = reinterpret_cast<void*>(&mneme_gpa_v1);
    }
    return;
  }
  interposer::replace_proc_address(symbol, pfn, version, flags);
}

CUresult mneme_gpa_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                      CUdriverProcAddressQueryResult* status) {
  auto real = driver().cuGetProcAddress_v2;
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && symbol) substitute(symbol, pfn, version, flags);
  return r;
}

CUresult mneme_gpa_v1(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  GpaV1 real = g_real_gpa_v1.load();
  if (!real) return mneme_gpa_v2(symbol, pfn, version, flags, nullptr);
  CUresult r = real(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS && symbol) substitute(symbol, pfn, version, flags);
  return r;
}

void* substitute_cuda_symbol(void* handle, const char* name) {
  void* p = real_dlsym(handle, name);
  if (!p) return p;
  if (std::strcmp(name, "cuGetProcAddress_v2") == 0) {
    if (p == reinterpret_cast<void*>(driver().cuGetProcAddress_v2)) return reinterpret_cast<void*>(&mneme_gpa_v2);
    return p;
  }
  if (std::strcmp(name, "cuGetProcAddress") == 0) {
    if (driver().handle && p == real_dlsym(driver().handle, "cuGetProcAddress")) {
      g_real_gpa_v1.store(reinterpret_cast<GpaV1>(p));
      return reinterpret_cast<void*>(&mneme_gpa_v1);
    }
    return p;
  }
  return interposer::replace_symbol(name, p);
}

}  // namespace

namespace mneme::common {

DlsymFn real_dlsym_function() {
  static DlsymFn fn = [] {
    // glibc >= 2.34 versions dlsym as GLIBC_2.34, older ones as GLIBC_2.2.5.
    auto f = reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
    if (!f) f = reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"));
    return f;
  }();
  return fn;
}

void* real_dlsym(void* handle, const char* name) { return real_dlsym_function()(handle, name); }

}  // namespace mneme::common

extern "C" {

__attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                                                     cuuint64_t flags,
                                                                     CUdriverProcAddressQueryResult* status) {
  return mneme_gpa_v2(symbol, pfn, version, flags, status);
}

// Shadows the C library's dlsym for the whole process (we are preloaded).
// Everything but the driver's entry points goes to the real dlsym through a
// sibling call, so the real one sees the original caller's return address and
// RTLD_NEXT keeps its meaning for other libraries.
__attribute__((visibility("default"), optimize("O2", "optimize-sibling-calls"))) void* dlsym(void* handle,
                                                                                              const char* name) {
  if (name[0] == 'c' && name[1] == 'u' && handle != RTLD_NEXT && !driver_loading() && interposer::watches_dlsym())
    return substitute_cuda_symbol(handle, name);
  return real_dlsym_function()(handle, name);
}

}  // extern "C"
