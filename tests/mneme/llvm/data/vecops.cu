// Test program of the LLVM tier: kernels with scalar parameters, a device
// variable, a __constant__ table, a libdevice call, a 2-D bounds check, and a
// loop over a device function (what the size levels default<Os|Oz> treat
// differently from default<O2>: unrolling, vectorization, inlining).
#include <cstdio>
#include <cstdlib>
#include <cmath>

__device__ int launches;
__constant__ float weights[4] = {1.0f, 0.5f, 0.25f, 0.125f};

__global__ void saxpy(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

__global__ void wave(int n, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = sinf(x[i]) * weights[i % 4];
  if (i == 0) atomicAdd(&launches, 1);
}

__global__ void stencil(const double* in, double* out, int nx, int ny) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x > 0 && y > 0 && x < nx - 1 && y < ny - 1)
    out[y * nx + x] = 0.25 * (in[y * nx + x - 1] + in[y * nx + x + 1] + in[(y - 1) * nx + x] + in[(y + 1) * nx + x]);
}

struct Affine {
  int n;
  float scale;
  double shift;
};

// Aggregates by value: specialization folds byval structs and vectors too.
__global__ void affine(Affine p, float* y, float4 bias) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.n) y[i] = p.scale * y[i] + (float)p.shift + bias.x;
}

// A device function with two call sites (so the inliner weighs its size).
__device__ float soft_clip(float v, float limit) {
  float r = v;
  if (r > limit) r = limit + 0.5f * (r - limit) / (1.0f + (r - limit));
  if (r < -limit) r = -limit - 0.5f * (-limit - r) / (1.0f + (-limit - r));
  return r;
}

// Weighted sums of the first 8 elements of each row of an n x m matrix, one
// thread per row, clipped twice: a fixed-length loop O2 unrolls fully and
// Os/Oz keep, and a device function called from two sites. Static: nvcc
// names it _Z6rowsumiiPKfPf, clang _ZL6rowsumiiPKfPf.
static __global__ void rowsum(int n, int m, const float* a, float* out) {
  int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= n) return;
  float s = 0.0f;
  for (int j = 0; j < 8; ++j) s += weights[j % 4] * a[row * m + j];
  out[row] = soft_clip(s, 2.0f) + soft_clip(-s, 8.0f);
}

#define CHECK(call)                                                              \
  do {                                                                           \
    cudaError_t err = (call);                                                    \
    if (err != cudaSuccess) {                                                    \
      fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(err));               \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

int main() {
  const int n = 1 << 16, nx = 256, ny = 128;
  float *x, *y;
  double *in, *out;
  CHECK(cudaMalloc(&x, n * sizeof(float)));
  CHECK(cudaMalloc(&y, n * sizeof(float)));
  CHECK(cudaMalloc(&in, nx * ny * sizeof(double)));
  CHECK(cudaMalloc(&out, nx * ny * sizeof(double)));
  float* host = (float*)malloc(n * sizeof(float));
  for (int i = 0; i < n; ++i) host[i] = 0.001f * (i % 997);
  CHECK(cudaMemcpy(x, host, n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(y, host, n * sizeof(float), cudaMemcpyHostToDevice));
  double* hin = (double*)malloc(nx * ny * sizeof(double));
  for (int i = 0; i < nx * ny; ++i) hin[i] = 0.5 * (i % 101);
  CHECK(cudaMemcpy(in, hin, nx * ny * sizeof(double), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(out, 0, nx * ny * sizeof(double)));
  saxpy<<<(n + 255) / 256, 256>>>(n, 2.0f, x, y);
  wave<<<(n + 127) / 128, 128>>>(n, x, y);
  stencil<<<dim3(nx / 16, ny / 16), dim3(16, 16)>>>(in, out, nx, ny);
  affine<<<(n + 255) / 256, 256>>>(Affine{n, 0.5f, 0.25}, y, make_float4(1.0f, 2.0f, 3.0f, 4.0f));
  rowsum<<<(n / 64 + 127) / 128, 128>>>(n / 64, 64, x, y);
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(host, y, sizeof(float), cudaMemcpyDeviceToHost));
  printf("vecops done y[0]=%f\n", host[0]);
  free(host);
  free(hin);
  return 0;
}
