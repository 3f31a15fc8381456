#include "memory_window.hpp"

#include <algorithm>

#include <cstdio>

#include "mneme/common/driver_api.hpp"
#include "mneme/common/settings.hpp"

using namespace mneme::common;

namespace mneme::rec {
namespace {

constexpr uint64_t kAlignment = 512;  // cudaMalloc guarantees 256; keep pitch-friendly

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

int current_device() {
  CUdevice dev = 0;
  if (driver().cuCtxGetDevice && driver().cuCtxGetDevice(&dev) == CUDA_SUCCESS) return dev;
  return 0;
}

// Where to try when the configured base is taken: like the default base
// (0x200000000000), away from the zones where the kernel places a process's own
// mappings (the mmap zone near 0x7fxx..., 0x13..-0x15.. under an unlimited
// stack, legacy bottom-up from 0x2aaa..., the program and its brk heap);
// record_agent/options.py FALLBACK_VA_BASES lists the same.
const uint64_t kFallbackBases[] = {0x300000000000ull, 0x100000000000ull};

}  // namespace

MemoryWindow& MemoryWindow::instance() {
  static MemoryWindow* w = new MemoryWindow();  // never destroyed: used until exit
  return *w;
}

MemoryWindow::Window& MemoryWindow::window_for(int device) {
  auto it = windows_.find(device);
  if (it != windows_.end()) return it->second;
  Window w;
  w.info.device = device;
  w.info.size = settings().va_size;
  w.info.base = settings().va_base + static_cast<uint64_t>(device) * settings().va_size;
  return windows_.emplace(device, w).first->second;
}

bool MemoryWindow::reserve(Window& w) {
  if (w.info.reserved) return true;
  if (w.failed) return false;
  auto& d = driver();
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = w.info.device;
  size_t gran = 0;
  if (d.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS && gran)
    w.granularity = gran;
  w.info.size = round_up(w.info.size, w.granularity);
  uint64_t wanted = w.info.base;
  CUresult first = CUDA_SUCCESS;
  bool ok = try_reserve_at(w, wanted, &first);
  for (uint64_t alt : kFallbackBases) {
    if (ok) break;
    if (alt == settings().va_base) continue;  // MNEME_VA_BASE named a fallback: tried already
    ok = try_reserve_at(w, alt + static_cast<uint64_t>(w.info.device) * w.info.size, nullptr);
    if (ok)
      std::fprintf(stderr, "mneme record: note: the window at 0x%llx is not available on device %d (%s); recording at"
                   " 0x%llx instead (the recording says where)\n", (unsigned long long)wanted, w.info.device,
                   first == CUDA_SUCCESS ? "granted elsewhere" : error_string(first),
                   (unsigned long long)w.info.base);
  }
  if (!ok) {
    std::fprintf(stderr,
                 "mneme record: warning: could not reserve a fixed address window of %llu bytes on device %d (tried"
                 " 0x%llx and fallbacks); allocations keep driver addresses and replay will relocate pointers. Set"
                 " MNEME_VA_BASE to a free range or lower -vass.\n",
                 (unsigned long long)w.info.size, w.info.device, (unsigned long long)wanted);
    w.info.base = wanted;
    w.failed = true;
    return false;
  }
  w.info.reserved = true;
  w.free_list[0] = w.info.size;
  return true;
}

bool MemoryWindow::try_reserve_at(Window& w, uint64_t base, CUresult* result) {
  auto& d = driver();
  CUdeviceptr got = 0;
  CUresult r = d.cuMemAddressReserve(&got, w.info.size, 0, base, 0);
  if (result) *result = r;
  if (r == CUDA_SUCCESS && got == base) {
    w.info.base = base;
    return true;
  }
  if (r == CUDA_SUCCESS) d.cuMemAddressFree(got, w.info.size);
  return false;
}

bool MemoryWindow::map_up_to(Window& w, uint64_t end_offset) {
  if (end_offset <= w.mapped_end) return true;
  auto& d = driver();
  uint64_t new_end = round_up(end_offset, w.granularity);
  uint64_t len = new_end - w.mapped_end;
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = w.info.device;
  CUmemGenericAllocationHandle h = 0;
  if (d.cuMemCreate(&h, len, &prop, 0) != CUDA_SUCCESS) return false;  // out of device memory
  CUdeviceptr at = w.info.base + w.mapped_end;
  if (d.cuMemMap(at, len, 0, h, 0) != CUDA_SUCCESS) {
    d.cuMemRelease(h);
    return false;
  }
  d.cuMemRelease(h);  // the mapping keeps the memory alive
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = w.info.device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (d.cuMemSetAccess(at, len, &access, 1) != CUDA_SUCCESS) return false;
  w.mapped_end = new_end;
  w.info.mapped_bytes = new_end;
  return true;
}

bool MemoryWindow::take_from_window(Window& w, uint64_t size, uint64_t* offset) {
  // First fit, lowest address: keeps the mapped part of the window small.
  for (auto it = w.free_list.begin(); it != w.free_list.end(); ++it) {
    if (it->second < size) continue;
    uint64_t off = it->first;
    if (!map_up_to(w, off + size)) return false;
    uint64_t rest = it->second - size;
    w.free_list.erase(it);
    if (rest) w.free_list[off + size] = rest;
    *offset = off;
    return true;
  }
  return false;
}

CUresult MemoryWindow::allocate(CUdeviceptr* out, size_t size, CUresult (*fallback)(CUdeviceptr*, size_t)) {
  int device = current_device();
  {
    std::lock_guard<std::mutex> lock(mu_);
    Window& w = window_for(device);
    uint64_t offset = 0;
    uint64_t rounded = round_up(size ? size : 1, kAlignment);
    if (reserve(w) && take_from_window(w, rounded, &offset)) {
      *out = w.info.base + offset;
      live_[*out] = Allocation{*out, size, device, true};
      return CUDA_SUCCESS;
    }
  }
  if (!fallback) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = fallback(out, size);
  if (r == CUDA_SUCCESS) {
    std::lock_guard<std::mutex> lock(mu_);
    live_[*out] = Allocation{*out, size, device, false};
    if (!fallback_used_[device] && windows_[device].info.reserved)
      std::fprintf(stderr, "mneme record: warning: the %llu-byte window on device %d is full; further allocations keep"
                   " driver addresses (raise -vass)\n", (unsigned long long)windows_[device].info.size, device);
    fallback_used_[device] = true;
  }
  return r;
}

bool MemoryWindow::release(CUdeviceptr ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end() || !it->second.in_window) return false;
  Window& w = window_for(it->second.device);
  uint64_t off = ptr - w.info.base;
  uint64_t len = round_up(it->second.size ? it->second.size : 1, kAlignment);
  live_.erase(it);
  auto next = w.free_list.lower_bound(off);
  if (next != w.free_list.end() && next->first == off + len) {  // merge with the following block
    len += next->second;
    next = w.free_list.erase(next);
  }
  if (next != w.free_list.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      return true;
    }
  }
  w.free_list[off] = len;
  return true;
}

void MemoryWindow::forget(CUdeviceptr ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.erase(ptr);
}

void MemoryWindow::track_managed(CUdeviceptr base, size_t size) {
  int device = current_device();
  std::lock_guard<std::mutex> lock(mu_);
  Allocation a{base, size, device, false};
  a.managed = true;
  live_[base] = a;
}

void MemoryWindow::forget_managed(CUdeviceptr ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it != live_.end() && it->second.managed) live_.erase(it);
}

std::vector<Allocation> MemoryWindow::live_allocations(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Allocation> out;
  for (const auto& [base, a] : live_)
    if (a.device == device) out.push_back(a);
  return out;
}

bool MemoryWindow::find(uint64_t addr, Allocation* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.upper_bound(addr);
  if (it == live_.begin()) return false;
  --it;
  if (addr >= it->second.base && addr < it->second.base + (it->second.size ? it->second.size : 1)) {
    *out = it->second;
    return true;
  }
  return false;
}

std::vector<WindowInfo> MemoryWindow::windows() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WindowInfo> out;
  for (const auto& [dev, w] : windows_) out.push_back(w.info);
  return out;
}

bool MemoryWindow::any_fallback(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = fallback_used_.find(device);
  return it != fallback_used_.end() && it->second;
}

}  // namespace mneme::rec
