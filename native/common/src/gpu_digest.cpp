#include "mneme/common/gpu_digest.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "mneme/common/driver_api.hpp"
#include "mneme/common/settings.hpp"

#ifdef MNEME_HAVE_DIGEST_PTX
#include "digest_ptx.h"  // kDigestPtx: the PTX of digest_kernel.cu (generated at build time)
#endif

namespace mneme::common {

namespace {
constexpr uint64_t kSub = 1ull << 20;         // bytes per block (digest_kernel.cu)
constexpr uint64_t kMaxPiece = 16ull << 20;  // SnapshotWriter::kChunk
constexpr unsigned kSubsPerPiece = unsigned(kMaxPiece / kSub);
}  // namespace

std::string digest_hex(const Digest& d) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)d.hi, (unsigned long long)d.lo);
  return buf;
}

bool GpuDigest::available() {
  if (state_ == 0) {
    std::string why;
    state_ = load(&why) ? 1 : -1;
    if (state_ < 0 && settings().verbose) std::fprintf(stderr, "mneme record: snapshots copy everything: %s\n", why.c_str());
  }
  return state_ > 0;
}

bool GpuDigest::load(std::string* why) {
#ifndef MNEME_HAVE_DIGEST_PTX
  *why = "this recorder was built without the digest kernel (no nvcc at build time)";
  return false;
#else
  if (!settings().gpu_digests) {
    *why = "MNEME_DIGESTS=0";
    return false;
  }
  auto& d = driver();
  if (!d.cuModuleLoadData || !d.cuModuleGetFunction || !d.cuLaunchKernel || !d.cuMemcpyHtoDAsync_v2) {
    *why = "the driver lacks an entry point the digest kernel needs";
    return false;
  }
  CUresult r = d.cuModuleLoadData(&module_, kDigestPtx);
  if (r == CUDA_SUCCESS) r = d.cuModuleGetFunction(&kernel_, module_, "mneme_snapshot_digest");
  if (r != CUDA_SUCCESS) {
    *why = std::string("cannot load the digest kernel: ") + error_string(r);
    return false;
  }
  return true;
#endif
}

bool GpuDigest::compute(const std::vector<std::pair<CUdeviceptr, uint64_t>>& pieces, CUstream stream,
                        std::vector<Digest>* out, std::string* why) {
  out->clear();
  if (pieces.empty()) return true;
  auto& d = driver();
  const size_t table_bytes = pieces.size() * 2 * sizeof(unsigned long long);
  const size_t result_bytes = pieces.size() * kSubsPerPiece * 2 * sizeof(unsigned long long);
  auto grow = [&](CUdeviceptr* p, size_t* capacity, size_t need) -> bool {
    if (*capacity >= need) return true;
    if (*p) d.cuMemFree_v2(*p);
    *p = 0;
    *capacity = 0;
    // The driver's own allocator (not the recorder's window): never part of a snapshot.
    if (d.cuMemAlloc_v2(p, need * 2) != CUDA_SUCCESS) return false;
    *capacity = need * 2;
    return true;
  };
  if (!grow(&table_, &table_capacity_, table_bytes) || !grow(&results_, &results_capacity_, result_bytes)) {
    *why = "cannot allocate the digest buffers";
    return false;
  }
  host_table_.resize(pieces.size() * 2);
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].second > kMaxPiece) {
      *why = "internal error: a snapshot piece is larger than 16 MiB";
      return false;
    }
    host_table_[2 * i] = pieces[i].first;
    host_table_[2 * i + 1] = pieces[i].second;
  }
  host_results_.resize(pieces.size() * kSubsPerPiece * 2);
  CUresult r = d.cuMemcpyHtoDAsync_v2(table_, host_table_.data(), table_bytes, stream);
  // Grid y is limited to 65535: launch in slices of pieces.
  for (size_t first = 0; r == CUDA_SUCCESS && first < pieces.size(); first += 65535) {
    unsigned count = unsigned(std::min<size_t>(65535, pieces.size() - first));
    CUdeviceptr table = table_ + first * 2 * sizeof(unsigned long long);
    CUdeviceptr results = results_ + first * kSubsPerPiece * 2 * sizeof(unsigned long long);
    void* params[] = {&table, &results};
    r = d.cuLaunchKernel(kernel_, kSubsPerPiece, count, 1, 256, 1, 1, 0, stream, params, nullptr);
  }
  if (r == CUDA_SUCCESS) r = d.cuMemcpyDtoHAsync_v2(host_results_.data(), results_, result_bytes, stream);
  if (r == CUDA_SUCCESS) r = d.cuStreamSynchronize(stream);
  if (r != CUDA_SUCCESS) {
    *why = std::string("the digest kernel failed: ") + error_string(r);
    state_ = -1;
    return false;
  }
  out->resize(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    Digest& g = (*out)[i];
    g.size = pieces[i].second;
    for (unsigned s = 0; s < kSubsPerPiece; ++s) {
      g.lo += host_results_[(i * kSubsPerPiece + s) * 2];
      g.hi += host_results_[(i * kSubsPerPiece + s) * 2 + 1];
    }
  }
  return true;
}

}  // namespace mneme::common
