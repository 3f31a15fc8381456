// Digests of device memory computed on the GPU (digest_kernel.cu), so that a
// snapshot copies only the pieces that changed since an earlier snapshot of
// the run: an iterative application's matrix, or inputs a kernel only reads,
// leave the device once. See docs/recording.md (Snapshot capture).
#pragma once
#include <cuda.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mneme::common {

struct Digest {
  uint64_t lo = 0, hi = 0;
  uint64_t size = 0;
  bool operator==(const Digest& o) const { return lo == o.lo && hi == o.hi && size == o.size; }
};

struct DigestHash {
  size_t operator()(const Digest& d) const { return size_t(d.lo ^ (d.hi * 0x9e3779b97f4a7c15ull) ^ d.size); }
};

std::string digest_hex(const Digest& d);

// One per context (it owns a module and buffers there). Not thread-safe: the
// recorder and the apply library call it under their locks.
class GpuDigest {
 public:
  // Whether digests are available: built with the kernel, not disabled
  // (MNEME_DIGESTS=0), and the kernel loaded. After a failure it stays off.
  bool available();
  // Digests of `pieces` ([base, size], size <= 16 MiB), on `stream` after the
  // work already queued there; waits for them. False (and *why): use none.
  bool compute(const std::vector<std::pair<CUdeviceptr, uint64_t>>& pieces, CUstream stream, std::vector<Digest>* out,
               std::string* why);

 private:
  bool load(std::string* why);
  int state_ = 0;  // 0: not tried, 1: ready, -1: off
  CUmodule module_ = nullptr;
  CUfunction kernel_ = nullptr;
  CUdeviceptr table_ = 0, results_ = 0;
  size_t table_capacity_ = 0, results_capacity_ = 0;
  std::vector<unsigned long long> host_table_, host_results_;
};

}  // namespace mneme::common
