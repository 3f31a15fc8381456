// Detects a pool (caching) allocator in the recorded process: PyTorch's
// caching allocator, CuPy's memory pool and RAPIDS' RMM allocate large device
// regions once and hand out pieces of them, so "every live allocation" is the
// whole pool (GBs) while a kernel reaches a few MBs. `--snapshot-scope auto`
// (the default) snapshots the reachable allocations when one is detected.
#pragma once
#include <cstdint>
#include <string>

namespace mneme::rec {

// An allocation this large that a kernel argument points into (not at its
// start) is a pool region, whatever library sub-allocates it.
constexpr uint64_t kPoolRegionBytes = 1ull << 30;

// The name of the pool allocator detected in this process ("" when none): a
// loaded library known to pool (checked again at each call until one is
// found), else "a sub-allocated region of 1 GiB or more" when
// `argument_inside_large_allocation`.
std::string pool_allocator(bool argument_inside_large_allocation);

}  // namespace mneme::rec
