// Detects a pool (caching) allocator in the recorded process: PyTorch's
// caching allocator, CuPy's memory pool and RAPIDS' RMM allocate large device
// regions once and hand out pieces of them, so "every live allocation" is the
// whole pool (GBs) while a kernel reaches a few MBs. `--snapshot-scope auto`
// (the default) snapshots the reachable allocations when one is detected.
#pragma once
#include <cstdint>
#include <string>

namespace mneme::rec {

// Allocations this large are pool regions whatever library made them.
constexpr uint64_t kPoolRegionBytes = 1ull << 30;

// The name of the pool allocator detected in this process ("" when none):
// a loaded library known to pool (checked again at each call until one is
// found), else "large allocation" when `largest_allocation` is a pool region.
std::string pool_allocator(uint64_t largest_allocation);

}  // namespace mneme::rec
