// A kernel launched with one shape (the one recorded and tuned) and with
// another grid, its result checked on the host: tests/gpu/test_apply.py.
//   apply_target [LAUNCHES [EXIT_AFTER]]
// EXIT_AFTER >= 0: exit(3) right after that launch, with everything still allocated.
#include <cstdio>
#include <cstdlib>
#include <vector>

__global__ void saxpy_apply(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

#define CHECK(call)                                                               \
  do {                                                                            \
    cudaError_t e = (call);                                                       \
    if (e != cudaSuccess) {                                                       \
      std::printf("FAIL: %s: %s\n", #call, cudaGetErrorString(e));               \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

int main(int argc, char** argv) {
  const int n = 1 << 20, m = 300000, block = 64;
  int launches = argc > 1 ? std::atoi(argv[1]) : 4;
  int exit_after = argc > 2 ? std::atoi(argv[2]) : -1;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) x[i] = float(i % 7), y[i] = 1.0f;
  float *dx, *dy;
  CHECK(cudaMalloc(&dx, n * sizeof(float)));
  CHECK(cudaMalloc(&dy, n * sizeof(float)));
  CHECK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  for (int k = 0; k < launches; ++k) {
    saxpy_apply<<<(n + block - 1) / block, block>>>(n, 2.0f, dx, dy);  // the recorded shape
    CHECK(cudaGetLastError());
    if (k == exit_after) {
      CHECK(cudaDeviceSynchronize());
      std::printf("exiting early after launch %d\n", k);
      std::exit(3);
    }
  }
  for (int k = 0; k < 2; ++k) {
    saxpy_apply<<<(m + block - 1) / block, block>>>(m, 1.0f, dx, dy);  // another grid
    CHECK(cudaGetLastError());
  }
  CHECK(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    float want = 1.0f + launches * 2.0f * x[i] + (i < m ? 2.0f * x[i] : 0.0f);
    if (y[i] != want) {
      std::printf("FAIL: y[%d] = %g, expected %g\n", i, y[i], want);
      return 1;
    }
  }
  std::printf("PASS\n");
  return 0;
}
