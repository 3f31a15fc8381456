// The apply plan: what `mneme run --apply` (mneme/apply/plan.py) decided to
// apply, read once from the file MNEME_APPLY_PLAN names. The policy (which
// results count, which code runs, which launches may match) is Python's; this
// is only its reader.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mneme::apply {

struct Shape {
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned shared_mem = 0;
};

struct PlanEntry {
  std::string name;          // mangled kernel name
  std::string static_hash;   // for messages
  uint64_t cubin_fnv = 0;    // FNV-1a 64 of the recorded module cubin (0: not checked)
  Shape recorded, tuned;
  std::string code_path;     // tuned cubin; empty: the application's own function with the tuned shape
  bool similar = false;      // other grids of the recorded block/shared memory may be applied
  // (parameter index, byte offset in it) of every device pointer the arguments hold (for --apply-verify)
  std::vector<std::pair<int, int>> pointers;
  std::vector<std::pair<int, std::string>> fixed;  // parameter index -> bytes the tuned code was specialized on
};

struct Plan {
  bool loaded = false;
  std::string error;
  int verify = 0;           // --apply-verify N
  bool force = false;       // --apply-force
  int cc_major = 0, cc_minor = 0;  // the tuning run's GPU
  int driver_version = 0;   // the tuning run's driver (0: unknown, not checked)
  std::vector<PlanEntry> entries;
};

// Parses the file; on failure `loaded` is false and `error` says why.
Plan read_plan(const std::string& path);

// FNV-1a 64 over bytes (mneme/apply/plan.py computes the same).
uint64_t fnv1a64(const void* data, size_t size);

}  // namespace mneme::apply
