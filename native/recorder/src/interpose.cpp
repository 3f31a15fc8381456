// Allocation redirection for unmodified programs (design.md section 4): cudart
// (static or shared) and most frameworks reach the driver through
// dlsym(handle, "cuGetProcAddress_v2") and then ask that function for every
// other entry point. Our exported `dlsym` hands out a wrapper of
// cuGetProcAddress which in turn hands out our allocation functions; programs
// linked against libcuda directly get the same functions through symbol
// interposition (LD_PRELOAD), since we export them under the driver's names.
#include <dlfcn.h>

#include <atomic>
#include <cstring>

#include "driver_api.hpp"
#include "memory_window.hpp"
#include "settings.hpp"
#include "uncaptured.hpp"

using namespace mneme::rec;

namespace {

using GpaV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
using GpaV2 = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using AllocAsyncFn = CUresult (*)(CUdeviceptr*, size_t, CUstream);
using FreeAsyncFn = CUresult (*)(CUdeviceptr, CUstream);
using AllocManagedFn = CUresult (*)(CUdeviceptr*, size_t, unsigned int);

std::atomic<GpaV1> g_real_gpa_v1{nullptr};
std::atomic<AllocManagedFn> g_real_alloc_managed{nullptr};

bool redirecting() { return settings().active && driver().loaded; }

CUresult fallback_alloc(CUdeviceptr* p, size_t size) { return driver().cuMemAlloc_v2(p, size); }

}  // namespace

extern "C" {

__attribute__((visibility("default"))) CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  if (!redirecting()) return driver().cuMemAlloc_v2 ? driver().cuMemAlloc_v2(dptr, bytesize) : CUDA_ERROR_NOT_INITIALIZED;
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  if (bytesize == 0) return CUDA_ERROR_INVALID_VALUE;  // the driver's answer too
  return MemoryWindow::instance().allocate(dptr, bytesize, fallback_alloc);
}

__attribute__((visibility("default"))) CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width,
                                                                    size_t height, unsigned int elementSize) {
  if (!redirecting())
    return driver().cuMemAllocPitch_v2 ? driver().cuMemAllocPitch_v2(dptr, pitch, width, height, elementSize)
                                       : CUDA_ERROR_NOT_INITIALIZED;
  if (!dptr || !pitch || width == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
  size_t p = (width + 511) / 512 * 512;  // the texture pitch alignment of current GPUs
  CUresult r = MemoryWindow::instance().allocate(dptr, p * height, fallback_alloc);
  if (r == CUDA_SUCCESS) *pitch = p;
  return r;
}

__attribute__((visibility("default"))) CUresult cuMemFree_v2(CUdeviceptr dptr) {
  if (!redirecting()) return driver().cuMemFree_v2 ? driver().cuMemFree_v2(dptr) : CUDA_ERROR_NOT_INITIALIZED;
  if (dptr == 0) return CUDA_SUCCESS;
  if (MemoryWindow::instance().release(dptr)) return CUDA_SUCCESS;
  MemoryWindow::instance().forget(dptr);
  return driver().cuMemFree_v2(dptr);
}

// The driver would answer with the bounds of the window's physical mapping;
// applications expect the bounds of their allocation.
__attribute__((visibility("default"))) CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size,
                                                                         CUdeviceptr dptr) {
  Allocation a;
  if (redirecting() && MemoryWindow::instance().find(dptr, &a) && a.in_window) {
    if (base) *base = a.base;
    if (size) *size = a.size;
    return CUDA_SUCCESS;
  }
  return driver().cuMemGetAddressRange_v2 ? driver().cuMemGetAddressRange_v2(base, size, dptr)
                                          : CUDA_ERROR_NOT_INITIALIZED;
}

__attribute__((visibility("default"))) CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream) {
  // Served synchronously from the window: the memory is valid at once, which
  // is a stronger guarantee than stream order.
  return cuMemAlloc_v2(dptr, bytesize);
}

__attribute__((visibility("default"))) CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize,
                                                                         CUmemoryPool, CUstream stream) {
  return cuMemAllocAsync(dptr, bytesize, stream);
}

__attribute__((visibility("default"))) CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  if (!redirecting()) return driver().cuMemFreeAsync ? driver().cuMemFreeAsync(dptr, stream) : CUDA_ERROR_NOT_INITIALIZED;
  // Work queued on the stream may still use the block: wait before reuse.
  driver().cuStreamSynchronize(stream);
  return cuMemFree_v2(dptr);
}

static CUresult mneme_cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  AllocManagedFn real = g_real_alloc_managed.load();
  CUresult r = real ? real(dptr, bytesize, flags) : CUDA_ERROR_NOT_INITIALIZED;
  if (r == CUDA_SUCCESS && dptr) MemoryWindow::instance().track_managed(*dptr, bytesize);
  return r;
}

static CUresult mneme_gpa_v2(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
static CUresult mneme_gpa_v1(const char*, void**, int, cuuint64_t);

// Replaces the driver's answer for the entry points the recorder serves.
static void substitute(const char* symbol, void** pfn, int version) {
  if (!pfn || !*pfn || !redirecting()) return;
  if (std::strcmp(symbol, "cuGetProcAddress") == 0) {
    if (version >= 12000) {
      *pfn = reinterpret_cast<void*>(&mneme_gpa_v2);
    } else {
      g_real_gpa_v1.store(reinterpret_cast<GpaV1>(*pfn));
      *pfn = reinterpret_cast<void*>(&mneme_gpa_v1);
    }
    return;
  }
  if (version < 3020) return;  // 32-bit size variants: leave them to the driver
  if (std::strcmp(symbol, "cuMemAlloc") == 0) *pfn = reinterpret_cast<void*>(&cuMemAlloc_v2);
  else if (std::strcmp(symbol, "cuMemAllocPitch") == 0) *pfn = reinterpret_cast<void*>(&cuMemAllocPitch_v2);
  else if (std::strcmp(symbol, "cuMemFree") == 0) *pfn = reinterpret_cast<void*>(&cuMemFree_v2);
  else if (std::strcmp(symbol, "cuMemGetAddressRange") == 0) *pfn = reinterpret_cast<void*>(&cuMemGetAddressRange_v2);
  else if (std::strcmp(symbol, "cuMemAllocAsync") == 0) *pfn = reinterpret_cast<void*>(&cuMemAllocAsync);
  else if (std::strcmp(symbol, "cuMemAllocFromPoolAsync") == 0) *pfn = reinterpret_cast<void*>(&cuMemAllocFromPoolAsync);
  else if (std::strcmp(symbol, "cuMemFreeAsync") == 0) *pfn = reinterpret_cast<void*>(&cuMemFreeAsync);
  else if (std::strcmp(symbol, "cuMemAllocManaged") == 0) {
    g_real_alloc_managed.store(reinterpret_cast<AllocManagedFn>(*pfn));
    *pfn = reinterpret_cast<void*>(&mneme_cuMemAllocManaged);
  }
}

static CUresult mneme_gpa_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* status) {
  auto real = driver().cuGetProcAddress_v2;
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && symbol) substitute(symbol, pfn, version);
  return r;
}

static CUresult mneme_gpa_v1(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  GpaV1 real = g_real_gpa_v1.load();
  if (!real) return mneme_gpa_v2(symbol, pfn, version, flags, nullptr);
  CUresult r = real(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS && symbol) substitute(symbol, pfn, version);
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
  if (std::strcmp(name, "cuGetProcAddress_v2") == 0) {
    if (p == reinterpret_cast<void*>(driver().cuGetProcAddress_v2)) return reinterpret_cast<void*>(&mneme_gpa_v2);
  } else if (std::strcmp(name, "cuGetProcAddress") == 0) {
    if (driver().handle && p == real_dlsym(driver().handle, "cuGetProcAddress")) {
      g_real_gpa_v1.store(reinterpret_cast<GpaV1>(p));
      return reinterpret_cast<void*>(&mneme_gpa_v1);
    }
  } else if (std::strcmp(name, "cuMemAlloc_v2") == 0 && p == reinterpret_cast<void*>(driver().cuMemAlloc_v2)) {
    return reinterpret_cast<void*>(&cuMemAlloc_v2);
  } else if (std::strcmp(name, "cuMemGetAddressRange_v2") == 0 &&
             p == reinterpret_cast<void*>(driver().cuMemGetAddressRange_v2)) {
    return reinterpret_cast<void*>(&cuMemGetAddressRange_v2);
  } else if (std::strcmp(name, "cuMemFree_v2") == 0 && p == reinterpret_cast<void*>(driver().cuMemFree_v2)) {
    return reinterpret_cast<void*>(&cuMemFree_v2);
  } else if (std::strcmp(name, "cuMemAllocPitch_v2") == 0 && p == reinterpret_cast<void*>(driver().cuMemAllocPitch_v2)) {
    return reinterpret_cast<void*>(&cuMemAllocPitch_v2);
  } else if (std::strcmp(name, "cuMemAllocAsync") == 0 && p == reinterpret_cast<void*>(driver().cuMemAllocAsync)) {
    return reinterpret_cast<void*>(&cuMemAllocAsync);
  } else if (std::strcmp(name, "cuMemFreeAsync") == 0 && p == reinterpret_cast<void*>(driver().cuMemFreeAsync)) {
    return reinterpret_cast<void*>(&cuMemFreeAsync);
  }
  return p;
}

// Shadows the C library's dlsym for the whole process (we are preloaded).
// Everything but the driver's entry points goes to the real dlsym through a
// sibling call, so the real one sees the original caller's return address and
// RTLD_NEXT keeps its meaning for other libraries.
__attribute__((visibility("default"), optimize("O2", "optimize-sibling-calls"))) void* dlsym(void* handle,
                                                                                              const char* name) {
  if (name[0] == 'c' && name[1] == 'u' && handle != RTLD_NEXT && settings().active && !driver_loading())
    return substitute_cuda_symbol(handle, name);
  return real_dlsym_function()(handle, name);
}

}  // extern "C"

