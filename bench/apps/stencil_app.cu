// An application-scale 3-D stencil for bench/record_overhead.py --app-scale:
// the 7-point Jacobi sweep of examples/stencil3d (ping-pong between two
// buffers) on an N^3 float grid, initialized on the device. Device state:
// 8 * N^3 bytes (N=1024: 8.6 GB).
//
// usage: stencil_app N SWEEPS      prints one JSON line: state_bytes, main_ms, checksum
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(call)                                                                          \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "stencil_app: %s failed: %s\n", #call, cudaGetErrorString(e_));  \
      std::exit(2);                                                                          \
    }                                                                                        \
  } while (0)

__global__ void init_field(int n, float* a, float* b) {
  const size_t total = (size_t)n * n * n;
  for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x) {
    const int i = idx % n, j = (idx / n) % n, k = idx / ((size_t)n * n);
    const float s = 6.2831853f / n;
    float v = sinf(s * i) * cosf(s * j) + 0.5f * sinf(2.0f * s * k);
    const int di = i - n / 3, dj = j - n / 2, dk = k - n / 2;
    if (di * di + dj * dj + dk * dk < (n / 8) * (n / 8)) v += 10.0f;
    a[idx] = b[idx] = v;
  }
}

__global__ void jacobi7(int n, const float* __restrict__ in, float* __restrict__ out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int j = blockIdx.y * blockDim.y + threadIdx.y;
  const int k = blockIdx.z * blockDim.z + threadIdx.z;
  if (i >= n || j >= n || k >= n) return;
  const size_t plane = (size_t)n * n, idx = (size_t)k * plane + (size_t)j * n + i;
  if (i == 0 || j == 0 || k == 0 || i == n - 1 || j == n - 1 || k == n - 1) {
    out[idx] = in[idx];
    return;
  }
  out[idx] = 0.4f * in[idx] + 0.1f * (in[idx - 1] + in[idx + 1] + in[idx - n] + in[idx + n] + in[idx - plane] + in[idx + plane]);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s N SWEEPS\n", argv[0]);
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const int n = std::atoi(argv[1]), sweeps = std::atoi(argv[2]);
  if (n < 3 || n > 1400 || sweeps < 1) {
    std::fprintf(stderr, "stencil_app: N must be 3..1400 and SWEEPS positive\n");
    return 2;
  }
  const size_t bytes = (size_t)n * n * n * sizeof(float);
  float *a, *b;
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  init_field<<<4096, 256>>>(n, a, b);
  CHECK(cudaGetLastError());
  const dim3 block(32, 4, 4), grid((n + 31) / 32, (n + 3) / 4, (n + 3) / 4);
  float *in = a, *out = b;
  for (int s = 0; s < sweeps; ++s) {
    jacobi7<<<grid, block>>>(n, in, out);
    float* t = in;
    in = out;
    out = t;
  }
  CHECK(cudaDeviceSynchronize());
  float probe = 0.0f;
  CHECK(cudaMemcpy(&probe, in + (size_t)(n / 2) * n * n + (size_t)(n / 2) * n + n / 2, sizeof(float), cudaMemcpyDeviceToHost));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"state_bytes\": %zu, \"sweeps\": %d, \"main_ms\": %.1f, \"center\": %.6f}\n", 2 * bytes, sweeps, ms, probe);
  return std::isfinite(probe) ? 0 : 1;
}
