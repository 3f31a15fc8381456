// Settings the record agent passes to the recorder through MNEME_* environment
// variables (documented in record_agent/README.md). Read once, at load time.
// The apply library reads them too (the GPU digest's MNEME_DIGESTS).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mneme::common {

struct InstanceSlice {
  long start = 0, stop = -1, step = 1;  // stop < 0: open-ended
};

struct Settings {
  bool active = false;            // MNEME_SPOOL_DIR set: record; otherwise pass through
  std::string spool_dir;
  // 32 TiB: far from every zone where Linux places a process's own mappings (the mmap zone
  // near 0x7f..., where shared libraries and the driver's ranges go; 0x15... under an
  // unlimited stack; legacy bottom-up from 0x2aaa...; executables and brk), so a fresh replay
  // process can reserve the same addresses (mneme/recording/window.py DEFAULT_VA_BASE says more).
  uint64_t va_base = 0x200000000000ull;
  uint64_t va_size = 4ull << 30;  // per device
  std::vector<std::string> kernel_regexes;   // MNEME_KERNEL_REGEX, newline-separated
  long skip = 0;                  // MNEME_SKIP: launches of each kernel skipped first
  long max_instances = 4;         // MNEME_MAX: distinct instances recorded per kernel (<=0: no cap)
  std::vector<InstanceSlice> instances;  // MNEME_INSTANCES: "start:stop:step,..."
  // MNEME_SNAPSHOT_SCOPE: all | reachable | auto (reachable where a pool allocator is detected)
  std::string snapshot_scope = "auto";
  bool eager_loading = false;     // CUDA_MODULE_LOADING=EAGER: every module loads at its load call
  uint64_t max_snapshot_bytes = 0;  // 0: unlimited
  uint64_t spool_max_bytes = 8ull << 30;
  int spool_writers = 0;          // MNEME_SPOOL_WRITERS: snapshot writer threads = stripe files (0: from the CPU count)
  std::vector<int> devices;       // empty: all
  bool record_duplicates = false;
  bool gpu_digests = true;        // MNEME_DIGESTS=0: snapshots copy every piece (no change detection on the GPU)
  std::string rank;               // only used in names/metadata
  bool verbose = false;
};

const Settings& settings();

}  // namespace mneme::common
