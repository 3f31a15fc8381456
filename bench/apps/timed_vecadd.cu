// vecadd with its own clock: start-up (first CUDA call), the launch loop, the rest; one line of JSON.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
__global__ void vecadd(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] += a[i] + b[i];
}
static double ms(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
int main(int argc, char** argv) {
  auto t0 = std::chrono::steady_clock::now();
  int n = std::atoi(argv[1]), iterations = std::atoi(argv[2]);
  cudaFree(0);
  auto t1 = std::chrono::steady_clock::now();
  float *a, *b, *c;
  cudaMalloc(&a, n * 4); cudaMalloc(&b, n * 4); cudaMalloc(&c, n * 4);
  cudaMemset(a, 0, n * 4); cudaMemset(b, 0, n * 4); cudaMemset(c, 0, n * 4);
  vecadd<<<(n + 255) / 256, 256>>>(a, b, c, n);
  cudaDeviceSynchronize();
  auto t2 = std::chrono::steady_clock::now();
  for (int it = 0; it < iterations; ++it) vecadd<<<(n + 255) / 256, 256>>>(a, b, c, n);
  auto t3 = std::chrono::steady_clock::now();
  cudaDeviceSynchronize();
  auto t4 = std::chrono::steady_clock::now();
  cudaFree(a); cudaFree(b); cudaFree(c);
  std::printf("{\"init_ms\": %.3f, \"setup_ms\": %.3f, \"launch_us\": %.4f, \"loop_ms\": %.3f, \"main_ms\": %.3f}\n", ms(t0, t1), ms(t1, t2),
              ms(t2, t3) * 1e3 / iterations, ms(t2, t4), ms(t0, t4));
  return 0;
}
