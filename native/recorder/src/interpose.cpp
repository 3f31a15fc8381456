// Allocation redirection for unmodified programs: the recorder's replacements
// of the driver's allocation functions, handed out by native/common's dlsym
// and cuGetProcAddress wrapper (mneme/common/interpose.hpp) and exported under
// the driver's names for programs linked against libcuda directly.
// cuGraphLaunch is handed out the same ways (graph_expansion.hpp).
#include <atomic>
#include <cstring>

#include "mneme/common/driver_api.hpp"
#include "mneme/common/interpose.hpp"
#include "mneme/common/settings.hpp"

#include "graph_expansion.hpp"
#include "memory_window.hpp"
#include "uncaptured.hpp"

using namespace mneme::common;
using namespace mneme::rec;

namespace {

using AllocAsyncFn = CUresult (*)(CUdeviceptr*, size_t, CUstream);
using FreeAsyncFn = CUresult (*)(CUdeviceptr, CUstream);
using AllocManagedFn = CUresult (*)(CUdeviceptr*, size_t, unsigned int);

std::atomic<AllocManagedFn> g_real_alloc_managed{nullptr};
// The driver's cuGraphLaunch as cuGetProcAddress handed it out, per variant
// (legacy and per-thread default stream).
std::atomic<GraphLaunchFn> g_real_graph_launch{nullptr}, g_real_graph_launch_ptsz{nullptr};

bool redirecting() { return settings().active && driver().loaded; }

bool capturing(CUstream stream) {
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  return driver().cuStreamIsCapturing && driver().cuStreamIsCapturing(stream, &cs) == CUDA_SUCCESS &&
         cs != CU_STREAM_CAPTURE_STATUS_NONE;
}

GraphLaunchFn real_graph_launch(bool per_thread) {
  GraphLaunchFn f = (per_thread ? g_real_graph_launch_ptsz : g_real_graph_launch).load();
  if (f) return f;
  return per_thread ? driver().cuGraphLaunch_ptsz : driver().cuGraphLaunch;
}

CUresult graph_launch(CUgraphExec exec, CUstream stream, bool per_thread) {
  GraphLaunchFn real = real_graph_launch(per_thread);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  return redirecting() ? launch_graph(exec, stream, real, per_thread) : real(exec, stream);
}

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

// In a stream capture an asynchronous allocation becomes a memory allocation
// node of the graph: memory the graph owns, left to the driver (the recorder
// launches such a graph whole: graph_expansion.hpp). Otherwise it is served
// synchronously from the window: the memory is valid at once, which is a
// stronger guarantee than stream order.
__attribute__((visibility("default"))) CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  if (redirecting() && capturing(stream) && driver().cuMemAllocAsync)
    return driver().cuMemAllocAsync(dptr, bytesize, stream);
  return cuMemAlloc_v2(dptr, bytesize);
}

__attribute__((visibility("default"))) CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize,
                                                                         CUmemoryPool pool, CUstream stream) {
  if (redirecting() && capturing(stream) && driver().cuMemAllocFromPoolAsync)
    return driver().cuMemAllocFromPoolAsync(dptr, bytesize, pool, stream);
  return cuMemAlloc_v2(dptr, bytesize);
}

__attribute__((visibility("default"))) CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  Allocation a;
  if (!redirecting() || (dptr && !MemoryWindow::instance().find(dptr, &a)))  // not the recorder's: a graph's, say
    return driver().cuMemFreeAsync ? driver().cuMemFreeAsync(dptr, stream) : CUDA_ERROR_NOT_INITIALIZED;
  // Freed inside a stream capture, the block stays allocated: the graph may
  // run any number of times, each using it.
  if (capturing(stream)) return CUDA_SUCCESS;
  // Work queued on the stream may still use the block: wait before reuse.
  driver().cuStreamSynchronize(stream);
  return cuMemFree_v2(dptr);
}

__attribute__((visibility("default"))) CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  return graph_launch(exec, stream, false);
}

__attribute__((visibility("default"))) CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
  return graph_launch(exec, stream, true);
}

static CUresult mneme_cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  AllocManagedFn real = g_real_alloc_managed.load();
  CUresult r = real ? real(dptr, bytesize, flags) : CUDA_ERROR_NOT_INITIALIZED;
  if (r == CUDA_SUCCESS && dptr) MemoryWindow::instance().track_managed(*dptr, bytesize);
  return r;
}

// Whether cuGetProcAddress answered `symbol` with its per-thread-default-stream
// variant: asked for, or (default flags) the same function as that variant.
static bool per_thread_variant(const char* symbol, void* pfn, int version, cuuint64_t flags) {
  if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) return true;
  if (flags & CU_GET_PROC_ADDRESS_LEGACY_STREAM) return false;
  void* ptsz = nullptr;
  auto real = driver().cuGetProcAddress_v2;
  return real && real(symbol, &ptsz, version, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr) == CUDA_SUCCESS &&
         ptsz == pfn;
}

static void substitute_graph_launch(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  const bool per_thread = per_thread_variant(symbol, *pfn, version, flags);
  (per_thread ? g_real_graph_launch_ptsz : g_real_graph_launch).store(reinterpret_cast<GraphLaunchFn>(*pfn));
  *pfn = per_thread ? reinterpret_cast<void*>(&cuGraphLaunch_ptsz) : reinterpret_cast<void*>(&cuGraphLaunch);
}

}  // extern "C"

// What native/common's interposition asks the recorder (mneme/common/interpose.hpp).
namespace mneme::common::interposer {

bool watches_dlsym() { return settings().active; }

bool replaces_proc_addresses() { return redirecting(); }

// The entry points the recorder serves, as cuGetProcAddress names them.
void replace_proc_address(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  if (version < 3020) return;  // 32-bit size variants: leave them to the driver
  if (std::strcmp(symbol, "cuMemAlloc") == 0) *pfn = reinterpret_cast<void*>(&cuMemAlloc_v2);
  else if (std::strcmp(symbol, "cuMemAllocPitch") == 0) *pfn = reinterpret_cast<void*>(&cuMemAllocPitch_v2);
  else if (std::strcmp(symbol, "cuMemFree") == 0) *pfn = reinterpret_cast<void*>(&cuMemFree_v2);
  else if (std::strcmp(symbol, "cuMemGetAddressRange") == 0) *pfn = reinterpret_cast<void*>(&cuMemGetAddressRange_v2);
  else if (std::strcmp(symbol, "cuMemAllocAsync") == 0) *pfn = reinterpret_cast<void*>(&cuMemAllocAsync);
  else if (std::strcmp(symbol, "cuMemAllocFromPoolAsync") == 0) *pfn = reinterpret_cast<void*>(&cuMemAllocFromPoolAsync);
  else if (std::strcmp(symbol, "cuMemFreeAsync") == 0) *pfn = reinterpret_cast<void*>(&cuMemFreeAsync);
  else if (std::strcmp(symbol, "cuGraphLaunch") == 0) substitute_graph_launch(symbol, pfn, version, flags);
  else if (std::strcmp(symbol, "cuMemAllocManaged") == 0) {
    g_real_alloc_managed.store(reinterpret_cast<AllocManagedFn>(*pfn));
    *pfn = reinterpret_cast<void*>(&mneme_cuMemAllocManaged);
  }
}

// The same entry points as libcuda exports them.
void* replace_symbol(const char* name, void* p) {
  if (std::strcmp(name, "cuMemAlloc_v2") == 0 && p == reinterpret_cast<void*>(driver().cuMemAlloc_v2)) {
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
  } else if (std::strcmp(name, "cuGraphLaunch") == 0 && p == reinterpret_cast<void*>(driver().cuGraphLaunch)) {
    return reinterpret_cast<void*>(&cuGraphLaunch);
  } else if (std::strcmp(name, "cuGraphLaunch_ptsz") == 0 && p == reinterpret_cast<void*>(driver().cuGraphLaunch_ptsz)) {
    return reinterpret_cast<void*>(&cuGraphLaunch_ptsz);
  }
  return p;
}

}  // namespace mneme::common::interposer
