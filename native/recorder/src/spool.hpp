// The recorder's side of the spool contract (record_agent/README.md): files
// are written under a temporary name and renamed into place, so the agent
// never sees half a file, and a crash leaves only `.tmp` leftovers it ignores.
#pragma once
#include <cuda.h>

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

#include "mneme/common/gpu_digest.hpp"

namespace mneme::rec {

// Lower-case hex of `n` bytes (JSON strings: mneme/common/text.hpp).
std::string hex(const void* data, size_t n);

bool make_dirs(const std::string& path);
// Writes `data` to `path` through `path.tmp` + fsync-less rename. On failure
// returns false with `*error` naming the file and the OS reason.
bool write_file_atomic(const std::string& path, const void* data, size_t n, std::string* error);
void remove_tree(const std::string& path);
uint64_t tree_bytes(const std::string& path);

// Where a run of a region's bytes sits in the snapshot's stripe files.
struct Piece {
  int stripe = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  bool has_digest = false;  // computed on the GPU (gpu_digest.hpp)
  common::Digest digest;
  bool copied = true;  // false: the same bytes were captured before (its digest says which); a hole in the stripe
};

using DigestSet = std::unordered_set<common::Digest, common::DigestHash>;

struct DeviceRegion {
  uint64_t base = 0;
  uint64_t size = 0;
  std::string kind;   // "heap" | "global" | "array"
  std::string name;
  std::vector<Piece> pieces;  // filled by SnapshotWriter::write
  // A CUDA array (kind "array"): `base` is its handle, its bytes are copied from `copy_from` (a staging
  // buffer the array was copied into), `array` its shape as launch.json gives it.
  uint64_t copy_from = 0;
  std::string array;
  uint64_t source() const { return copy_from ? copy_from : base; }
};

// Copies device regions into stripe files `<prefix>.<k>.bin` through a pool of
// pinned staging buffers: the device-to-host copies of later chunks overlap
// the file writes of earlier ones. Writer thread k alone writes stripe k and
// consecutive chunks go to consecutive stripes, so the writes run in parallel
// without sharing a file (one thread's page-cache writes top out near
// 3.5 GB/s; 8 threads reach 16-22 GB/s on the H100 machine, the copy engine
// 55). Stripe files per snapshot: min(writer threads, chunks), at least one,
// so a small snapshot opens few files. The layout (stripe count included)
// depends only on the region list, so a prologue and an epilogue of the same
// regions have the same pieces and the same stripe files.
class SnapshotWriter {
 public:
  static constexpr uint64_t kChunk = 16ull << 20;
  SnapshotWriter();
  ~SnapshotWriter();
  // Stripe files `<prefix>.0.bin` .. of the last write: min(writer threads
  // (MNEME_SPOOL_WRITERS; default half the CPUs, 4 to 16), its 16 MiB
  // chunks), at least 1.
  int last_stripes() const;
  // `scan` (may be empty) sees every chunk's host bytes before they are
  // written, in region order; it may append regions to `regions`
  // (reachable-scope discovery). Stops with an error past `byte_cap` (0: none).
  // With `entry_digests` (and no `scan`), every piece's digest is computed on
  // the GPU first and a piece whose digest was captured before (remembered
  // from committed entries, or earlier in this entry: `entry_digests`) is not
  // copied: its bytes stay a hole in the stripe file and the agent names them
  // by the digest. The digests of the pieces copied go into `entry_digests`.
  bool write(const std::string& prefix, std::vector<DeviceRegion>& regions,
             const std::function<void(const DeviceRegion&, const unsigned char*, size_t)>& scan,
             uint64_t byte_cap, uint64_t* bytes_written, std::string* error, DigestSet* entry_digests = nullptr);
  // The entry whose copies added `digests` is committed: later snapshots may refer to them.
  // Thread-safe (the recorder commits on the application's thread, snapshots run on a worker).
  void remember(const DigestSet& digests);
  // The stream the snapshots' digests and copies run on (created at the first use; null with *error).
  CUstream copy_stream(std::string* error);
  // Whether the last write() failed writing the spool (a file), not reading the device.
  bool last_failure_was_io() const;
  // Of the last write: bytes actually copied off the device, seconds spent on digests (0: none).
  uint64_t last_copied_bytes() const;
  double last_digest_seconds() const;
  // Of the last write: seconds the capture thread waited for a free staging
  // buffer (file writes behind) and for device-to-host copies (copies behind);
  // the set-up of the staging pool it paid (when the pool had to grow); the
  // span of its file writes, first start to last end (sustained write rate).
  double last_writer_wait_seconds() const;
  double last_copy_wait_seconds() const;
  double last_setup_seconds() const;
  double last_write_seconds() const;

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace mneme::rec
