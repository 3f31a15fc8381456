// A kernel reading a __device__ global and a __constant__ table, and writing
// another __device__ global: the recording must carry their values per instance.
#include <cstdio>
__device__ float scale = 0.0f;
__constant__ int offsets[4];
__device__ unsigned int launches = 0;

__global__ void scaled_copy(const float* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * scale + offsets[i % 4];
  if (i == 0) atomicAdd(&launches, 1u);
}

int main() {
  const int n = 1000;
  float h[n];
  for (int i = 0; i < n; ++i) h[i] = float(i);
  float *in, *out;
  cudaMalloc(&in, n * sizeof(float));
  cudaMalloc(&out, n * sizeof(float));
  cudaMemcpy(in, h, sizeof h, cudaMemcpyHostToDevice);
  int offs[4] = {1, 2, 3, 4};
  cudaMemcpyToSymbol(offsets, offs, sizeof offs);
  for (int k = 1; k <= 2; ++k) {
    float s = 1.5f * k;
    cudaMemcpyToSymbol(scale, &s, sizeof s);
    scaled_copy<<<(n + 127) / 128, 128>>>(in, out, n);
  }
  cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
  unsigned int count = 0;
  cudaMemcpyFromSymbol(&count, launches, sizeof count);
  std::printf("globals: out[5]=%g launches=%u\n", h[5], count);
  return (h[5] == 5 * 3.0f + 2 && count == 2) ? 0 : 1;
}
