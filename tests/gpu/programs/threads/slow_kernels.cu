// A kernel that runs for a while (spin: SPIN_MS of GPU time) on one stream and
// a quick one on another, launched right after it. Recording `quick` makes the
// recorder wait for `spin` (its prologue needs the context idle); recording
// `spin` makes it wait for spin itself (the epilogue). With a deadline below
// SPIN_MS both waits pass their deadline: tests/gpu/test_threads.py checks the
// instance is abandoned and the application's output stays the same.
//   slow_kernels [SPIN_MS=3000]
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#include "check.h"

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin(unsigned long long ns, int* done) {
  const unsigned long long start = global_ns();
  while (global_ns() - start < ns) {
  }
  if (threadIdx.x == 0) *done = 1;
}

__global__ void quick(int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2 * i + 1;
}

int main(int argc, char** argv) {
  const long spin_ms = argc > 1 ? std::atol(argv[1]) : 3000;
  const int n = 4096;
  int *done = nullptr, *out = nullptr;
  CHECK(cudaMalloc(&done, sizeof(int)));
  CHECK(cudaMalloc(&out, n * sizeof(int)));
  CHECK(cudaMemset(done, 0, sizeof(int)));
  CHECK(cudaMemset(out, 0, n * sizeof(int)));
  CHECK(cudaDeviceSynchronize());
  cudaStream_t a, b;
  CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  spin<<<1, 32, 0, a>>>((unsigned long long)spin_ms * 1000000ull, done);
  quick<<<(n + 255) / 256, 256, 0, b>>>(out, n);
  CHECK(cudaDeviceSynchronize());
  int host_done = 0, bad = 0;
  int* host = static_cast<int*>(std::malloc(n * sizeof(int)));
  CHECK(cudaMemcpy(&host_done, done, sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(host, out, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) bad += host[i] != 2 * i + 1;
  std::printf("slow_kernels: %s (spin %ld ms)\n", host_done == 1 && bad == 0 ? "ok" : "FAILED", spin_ms);
  return host_done == 1 && bad == 0 ? 0 : 1;
}
