// Host threads launching concurrently, each on its own stream, over managed
// memory, while other host threads read and write other managed buffers.
// With -DWITH_CUBLAS each launching thread also runs cublasDgemv with its own
// handle. The program checks its own results and prints one line.
//   threads_managed [LAUNCH_THREADS=4] [HOST_THREADS=2] [ROUNDS=8]
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
#include <atomic>
#include <cuda_runtime.h>
#ifdef WITH_CUBLAS
#include <cublas_v2.h>
#endif

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); std::exit(3); } } while (0)

__global__ void axpy(double a, const double* x, double* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}

int main(int argc, char** argv) {
  const int nlaunch = argc > 1 ? std::atoi(argv[1]) : 4;
  const int nhost = argc > 2 ? std::atoi(argv[2]) : 2;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 8;
  const int n = 1 << 14, m = 64;
  std::vector<double*> xs(nlaunch), ys(nlaunch), mats(nlaunch), hostbufs(nhost);
  for (int t = 0; t < nlaunch; ++t) {
    CHECK(cudaMallocManaged(&xs[t], n * sizeof(double)));
    CHECK(cudaMallocManaged(&ys[t], n * sizeof(double)));
    CHECK(cudaMallocManaged(&mats[t], size_t(m) * n * sizeof(double)));
    for (int i = 0; i < n; ++i) { xs[t][i] = 1.0 + (i % 7); ys[t][i] = t; }
    for (size_t i = 0; i < size_t(m) * n; ++i) mats[t][i] = (i % 5) * 0.25;
  }
  for (int h = 0; h < nhost; ++h) {
    CHECK(cudaMallocManaged(&hostbufs[h], n * sizeof(double)));
    for (int i = 0; i < n; ++i) hostbufs[h][i] = 0;
  }
  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> hosts;
  for (int h = 0; h < nhost; ++h)
    hosts.emplace_back([&, h] {  // host compute on managed buffers no kernel touches
      long iters = 0;
      while (!done.load(std::memory_order_relaxed)) {
        for (int i = 0; i < n; ++i) hostbufs[h][i] = hostbufs[h][i] * 0.5 + i;
        ++iters;
      }
      if (iters == 0) failures++;
    });
  std::vector<std::thread> launchers;
  for (int t = 0; t < nlaunch; ++t)
    launchers.emplace_back([&, t] {
      cudaStream_t s;
      CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
#ifdef WITH_CUBLAS
      cublasHandle_t handle;
      if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) { failures++; return; }
      cublasSetStream(handle, s);
      double* out;
      CHECK(cudaMallocManaged(&out, m * sizeof(double)));
#endif
      for (int r = 0; r < rounds; ++r) {
        axpy<<<(n + 255) / 256, 256, 0, s>>>(2.0, xs[t], ys[t], n);
#ifdef WITH_CUBLAS
        const double one = 1.0, zero = 0.0;
        // out = mats^T-shaped gemv: (m x n, column-major with lda = m) * x
        if (cublasDgemv(handle, CUBLAS_OP_N, m, n, &one, mats[t], m, xs[t], 1, &zero, out, 1)
            != CUBLAS_STATUS_SUCCESS) failures++;
#endif
      }
      CHECK(cudaStreamSynchronize(s));
      for (int i = 0; i < n; ++i)
        if (ys[t][i] != t + rounds * 2.0 * (1.0 + (i % 7))) { failures++; break; }
#ifdef WITH_CUBLAS
      double expect0 = 0;
      for (int j = 0; j < n; ++j) expect0 += mats[t][size_t(j) * m] * xs[t][j];
      if (out[0] != expect0) failures++;
      cublasDestroy(handle);
      CHECK(cudaFree(out));
#endif
      CHECK(cudaStreamDestroy(s));
    });
  for (auto& th : launchers) th.join();
  done = true;
  for (auto& th : hosts) th.join();
  std::printf("threads_managed: %s (%d launch threads, %d host threads, %d rounds)\n",
              failures ? "FAILED" : "ok", nlaunch, nhost, rounds);
  return failures ? 1 : 0;
}
