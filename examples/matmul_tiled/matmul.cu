// A tiled single-precision matrix multiply, C = A * B (n x n, row-major): the
// compute-bound, shared-memory workload of the examples.
//
// Each block computes a t x t tile of C, staging t x t tiles of A and B through
// dynamic shared memory (2*t*t floats). The tile size t is the block size,
// chosen on the command line, so one binary shows how launch shape and shared
// memory trade off, and a replay can try other tiles by changing block and
// shared_mem together. The kernel needs a square block (blockDim.x ==
// blockDim.y == t); any other shape computes a wrong C, which replay
// verification reports.
//
// usage: matmul [n [tile]]      (defaults: n = 2048, tile = 16; tile <= 32)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "example_util.h"

namespace {

const char* kUsage = "[n [tile]]";

__global__ void matmul_tiled(int n, const float* __restrict__ a, const float* __restrict__ b,
                             float* __restrict__ c) {
  extern __shared__ float tiles[];
  const int t = blockDim.x;
  float* a_tile = tiles;
  float* b_tile = tiles + t * t;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * t + ty, col = blockIdx.x * t + tx;
  float acc = 0.0f;
  for (int k0 = 0; k0 < n; k0 += t) {
    a_tile[ty * t + tx] = (row < n && k0 + tx < n) ? a[(size_t)row * n + k0 + tx] : 0.0f;
    b_tile[ty * t + tx] = (k0 + ty < n && col < n) ? b[(size_t)(k0 + ty) * n + col] : 0.0f;
    __syncthreads();
    for (int kk = 0; kk < t; ++kk) acc += a_tile[ty * t + kk] * b_tile[kk * t + tx];
    __syncthreads();
  }
  if (row < n && col < n) c[(size_t)row * n + col] = acc;
}

// Deterministic values in [-1, 1) (a 64-bit LCG), the same on every run.
std::vector<float> pseudo_random(size_t count, uint64_t seed) {
  std::vector<float> v(count);
  uint64_t state = seed;
  for (auto& e : v) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    e = (float)((state >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = (int)example::arg_or(argc, argv, 1, 2048, 16384, "n", kUsage);
  const int t = (int)example::arg_or(argc, argv, 2, 16, 32, "tile", kUsage);
  const size_t count = (size_t)n * n;
  const size_t bytes = count * sizeof(float);
  const size_t shared_bytes = 2 * (size_t)t * t * sizeof(float);
  std::printf("matmul_tiled: n=%d, tile %dx%d (%zu bytes of shared memory per block)\n", n, t, t, shared_bytes);

  const std::vector<float> a = pseudo_random(count, 1), b = pseudo_random(count, 2);
  float *d_a, *d_b, *d_c;
  CUDA_CHECK(cudaMalloc(&d_a, bytes));
  CUDA_CHECK(cudaMalloc(&d_b, bytes));
  CUDA_CHECK(cudaMalloc(&d_c, bytes));
  CUDA_CHECK(cudaMemcpy(d_a, a.data(), bytes, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_b, b.data(), bytes, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(d_c, 0, bytes));

  const dim3 block(t, t);
  const dim3 grid((n + t - 1) / t, (n + t - 1) / t);
  example::KernelTimer timer("matmul_tiled");
  const int repetitions = 5;  // the same product each time: a stable kernel time
  for (int r = 0; r < repetitions; ++r) {
    timer.start();
    matmul_tiled<<<grid, block, shared_bytes>>>(n, d_a, d_b, d_c);
    timer.stop();
    CUDA_CHECK_LAUNCH();
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> c(count);
  CUDA_CHECK(cudaMemcpy(c.data(), d_c, bytes, cudaMemcpyDeviceToHost));
  timer.report();
  const std::vector<float> times = timer.times_ms();
  std::printf("throughput %.1f GFLOP/s (last launch)\n", 2.0 * n * n * (double)n / (times.back() * 1e6));

  // Host check, O(n^2) instead of the O(n^3) product:
  // (1) every row sum of C equals A * (B * ones), which catches any missing or
  //     doubled tile; (2) 256 entries recomputed in double. Tolerances scale
  //     with |A| * |B| (the size of the terms summed), float rounding is ~1e-6.
  std::vector<double> b_rows(n, 0.0), b_abs_rows(n, 0.0);
  for (int k = 0; k < n; ++k)
    for (int j = 0; j < n; ++j) {
      b_rows[k] += b[(size_t)k * n + j];
      b_abs_rows[k] += std::fabs(b[(size_t)k * n + j]);
    }
  int bad_rows = 0, bad_entries = 0;
  for (int i = 0; i < n; ++i) {
    double expected = 0.0, scale = 0.0, got = 0.0;
    for (int k = 0; k < n; ++k) {
      expected += (double)a[(size_t)i * n + k] * b_rows[k];
      scale += std::fabs(a[(size_t)i * n + k]) * b_abs_rows[k];
    }
    for (int j = 0; j < n; ++j) got += c[(size_t)i * n + j];
    if (!(std::fabs(got - expected) <= 1e-5 * scale)) ++bad_rows;
  }
  uint64_t state = 12345;
  for (int s = 0; s < 256; ++s) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const int i = (int)((state >> 33) % n), j = (int)((state >> 13) % n);
    double expected = 0.0, scale = 0.0;
    for (int k = 0; k < n; ++k) {
      expected += (double)a[(size_t)i * n + k] * b[(size_t)k * n + j];
      scale += std::fabs((double)a[(size_t)i * n + k] * b[(size_t)k * n + j]);
    }
    if (!(std::fabs(c[(size_t)i * n + j] - expected) <= 1e-5 * scale)) ++bad_entries;
  }
  cudaFree(d_a);
  cudaFree(d_b);
  cudaFree(d_c);

  char reason[160] = "";
  if (bad_rows || bad_entries)
    std::snprintf(reason, sizeof reason, "%d of %d row sums and %d of 256 sampled entries differ from the host",
                  bad_rows, n, bad_entries);
  return example::verdict(bad_rows == 0 && bad_entries == 0, reason);
}
