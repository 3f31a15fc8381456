// Serves the application's device allocations from a window reserved at a
// fixed virtual address (one window per device), so that pointers the kernel
// finds in memory have the same values at replay. Physical memory is mapped on
// demand, one allocation-granularity step (2 MiB on H100) at a time. Where the
// window cannot be had (address taken, window full) allocations fall back to
// the driver and are tracked, so the recording can say replay must relocate.
#pragma once
#include <cuda.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace mneme::rec {

struct Allocation {
  uint64_t base = 0;
  uint64_t size = 0;    // bytes the application asked for
  int device = 0;
  bool in_window = false;
  bool managed = false;  // cudaMallocManaged: the driver's address, captured like device memory
};

struct WindowInfo {
  int device = 0;
  uint64_t base = 0;
  uint64_t size = 0;
  bool reserved = false;
  uint64_t mapped_bytes = 0;
};

class MemoryWindow {
 public:
  static MemoryWindow& instance();


  // Allocate `size` bytes on the current context's device; falls back to the
  // driver's allocator (via `fallback`) when the window cannot serve it.
  CUresult allocate(CUdeviceptr* out, size_t size, CUresult (*fallback)(CUdeviceptr*, size_t));
  // Frees a tracked allocation. Returns false when `ptr` is not in the window
  // (the caller forwards to the driver); foreign allocations are untracked here.
  bool release(CUdeviceptr ptr);
  void forget(CUdeviceptr ptr);  // a fallback allocation was freed by the driver
  // Managed memory keeps the driver's address (no API places it); it is tracked
  // so that snapshots capture it like device memory and replay maps device
  // memory at the same addresses. Idempotent (the interposed allocation and the
  // CUPTI callback both report it).
  void track_managed(CUdeviceptr base, size_t size);
  void forget_managed(CUdeviceptr ptr);  // no-op unless `ptr` is a tracked managed allocation's base

  std::vector<Allocation> live_allocations(int device) const;
  bool find(uint64_t addr, Allocation* out) const;  // allocation containing addr
  std::vector<WindowInfo> windows() const;
  bool any_fallback(int device) const;

 private:
  struct Window {
    WindowInfo info;
    bool failed = false;
    uint64_t granularity = 2ull << 20;
    uint64_t mapped_end = 0;                 // offset up to which memory is mapped
    std::map<uint64_t, uint64_t> free_list;  // offset -> length
  };
  Window& window_for(int device);
  bool reserve(Window& w);
  bool try_reserve_at(Window& w, uint64_t base, CUresult* result);
  bool map_up_to(Window& w, uint64_t end_offset);
  bool take_from_window(Window& w, uint64_t size, uint64_t* offset);

  mutable std::mutex mu_;
  std::map<int, Window> windows_;
  std::map<uint64_t, Allocation> live_;  // base -> allocation
  std::map<int, bool> fallback_used_;
};

}  // namespace mneme::rec
