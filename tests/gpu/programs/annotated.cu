// Declares a verification policy for its output buffer with mneme/annotate.h;
// the recording must carry it on that region.
#include <mneme/annotate.h>

#include <cstdio>

__global__ void softish(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] / (1.0f + fabsf(x[i]));
}

int main() {
  const int n = 512;
  float *x, *y;
  cudaMalloc(&x, n * sizeof(float));
  cudaMalloc(&y, n * sizeof(float));
  cudaMemset(x, 0, n * sizeof(float));
  int rc = mneme::annotate(y, mneme::Metadata{"f32", "relative", 1e-5, "linf"});
  softish<<<2, 256>>>(x, y, n);
  cudaDeviceSynchronize();
  std::printf("annotated: annotate returned %d\n", rc);
  return 0;
}
