// An iterative solver shape: two kernels, many launches each, same arguments
// (memory differs per iteration), plus cudaMallocAsync, cudaMallocPitch and a
// cudaLaunchKernelExC launch, to exercise instance selection and allocators.
#include <cuda.h>

#include <cstdio>

__global__ void relax(float* x, const float* b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = 0.5f * (x[i] + b[i]);
}

__global__ void residual(const float* x, const float* b, float* r, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) r[i] = b[i] - x[i];
}

__global__ void fill_pitched(float* p, size_t pitch, int w, int h) {
  int x = threadIdx.x, y = blockIdx.x;
  if (x < w && y < h) reinterpret_cast<float*>(reinterpret_cast<char*>(p) + y * pitch)[x] = float(y * 1000 + x);
}

int main(int argc, char** argv) {
  int iterations = argc > 1 ? atoi(argv[1]) : 10;
  const int n = 4096;
  cudaStream_t s;
  cudaStreamCreate(&s);
  float *x, *b, *r;
  cudaMallocAsync(&x, n * sizeof(float), s);
  cudaMallocAsync(&b, n * sizeof(float), s);
  cudaMalloc(&r, n * sizeof(float));
  cudaMemsetAsync(x, 0, n * sizeof(float), s);
  float ones[n];
  for (int i = 0; i < n; ++i) ones[i] = 1.0f;
  cudaMemcpyAsync(b, ones, sizeof ones, cudaMemcpyHostToDevice, s);
  for (int it = 0; it < iterations; ++it) {
    relax<<<n / 256, 256, 0, s>>>(x, b, n);
    residual<<<n / 256, 256, 0, s>>>(x, b, r, n);
  }
  float* pitched;
  size_t pitch = 0;
  cudaMallocPitch(&pitched, &pitch, 100 * sizeof(float), 8);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(8);
  cfg.blockDim = dim3(128);
  cfg.stream = s;
  int w = 100, h = 8;
  void* args[] = {&pitched, &pitch, &w, &h};
  cudaLaunchKernelExC(&cfg, (const void*)fill_pitched, args);
  float last = 0, p = 0;
  cudaMemcpyAsync(&last, r, sizeof last, cudaMemcpyDeviceToHost, s);
  cudaMemcpy2DAsync(&p, sizeof p, reinterpret_cast<char*>(pitched) + 7 * pitch + 99 * sizeof(float), pitch,
                    sizeof p, 1, cudaMemcpyDeviceToHost, s);
  cudaStreamSynchronize(s);
  cudaFreeAsync(x, s);
  cudaFreeAsync(b, s);
  cudaStreamSynchronize(s);
  // Allocation bounds as the application asked for them (not the window's mapping).
  CUdeviceptr range_base = 0;
  size_t range_size = 0;
  cuMemGetAddressRange(&range_base, &range_size, (CUdeviceptr)(r + 10));
  bool range_ok = range_base == (CUdeviceptr)r && range_size == n * sizeof(float);
  std::printf("iterative: residual=%g pitched=%g pitch=%zu range_ok=%d\n", last, p, pitch, (int)range_ok);
  return p == 7099.0f && range_ok ? 0 : 1;
}
