// Vector add: the example every mneme walkthrough records, replays and tunes.
// Plain CUDA, built by plain nvcc (see Makefile); nothing mneme-specific.
//
//   ./vecadd [n] [iterations]
//
// Fills a[i] = i * 0.5, b[i] = 2 - i * 0.25 (exact in float32 for the sizes
// used), launches vecadd `iterations` times (c += a + b each time, so every
// launch sees different memory), checks the result on the host and prints it.
// Exit status: 0 when the result is right, 3 when not, 1 on a CUDA error.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#define CHECK(call)                                                                  \
  do {                                                                               \
    cudaError_t err_ = (call);                                                       \
    if (err_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

__global__ void vecadd(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] += a[i] + b[i];
}

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : (1 << 20);
  int iterations = argc > 2 ? std::atoi(argv[2]) : 1;
  std::vector<float> a(n), b(n), c(n);
  for (int i = 0; i < n; ++i) {
    a[i] = i * 0.5f;
    b[i] = 2.0f - i * 0.25f;
  }
  float *da, *db, *dc;
  CHECK(cudaMalloc(&da, n * sizeof(float)));
  CHECK(cudaMalloc(&db, n * sizeof(float)));
  CHECK(cudaMalloc(&dc, n * sizeof(float)));
  CHECK(cudaMemcpy(da, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db, b.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(dc, 0, n * sizeof(float)));
  int block = 256, grid = (n + block - 1) / block;
  for (int it = 0; it < iterations; ++it) vecadd<<<grid, block>>>(da, db, dc, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(c.data(), dc, n * sizeof(float), cudaMemcpyDeviceToHost));
  // Check every element, or an evenly spread sample when that would take long.
  long long work = (long long)n * iterations;
  int step = work > 100000000LL ? (int)(work / 100000000LL) + 1 : 1;
  int bad = 0;
  for (int i = 0; i < n; i = (i + step < n || i == n - 1) ? i + step : n - 1) {
    float expected = 0.0f;  // the same float additions, in the same order, as the kernel
    for (int it = 0; it < iterations; ++it) expected += a[i] + b[i];
    if (c[i] != expected) ++bad;
  }
  std::printf("vecadd n=%d iterations=%d: %s (a=%p b=%p c=%p)\n", n, iterations, bad ? "WRONG" : "ok", (void*)da,
              (void*)db, (void*)dc);
  CHECK(cudaFree(da));
  CHECK(cudaFree(db));
  CHECK(cudaFree(dc));
  return bad ? 3 : 0;
}
