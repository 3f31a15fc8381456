// The shape of an application the recorder once hung: OpenMP threads, some
// launching (each with its own stream and, with -DWITH_CUBLAS, its own cuBLAS
// handle running cublasDgemv over cudaMallocManaged buffers), the others
// computing on the host over other managed buffers the whole time. Each
// launching thread synchronizes its stream every round and reads its managed
// result on the host (so its pages go back and forth), as such programs do.
// The program checks its results and prints one line.
//   threads_omp [LAUNCH_THREADS=4] [HOST_THREADS=4] [ROUNDS=50] [N=65536] [M=128]
// Build: nvcc -O2 -Xcompiler -fopenmp [-DWITH_CUBLAS ... -lcublas] threads_omp.cu
#include <omp.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "check.h"
#ifdef WITH_CUBLAS
#include <cublas_v2.h>
#endif

__global__ void axpy(double a, const double* x, double* y, long n) {
  long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}

// y[i] = sum_j A[j*n + i] * x[j] over m columns (the gemv without cuBLAS).
__global__ void colsum(const double* a, const double* x, double* y, long n, int m) {
  long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  double s = 0;
  for (int j = 0; j < m; ++j) s += a[j * n + i] * x[j];
  y[i] = s;
}

int main(int argc, char** argv) {
  const int nlaunch = argc > 1 ? std::atoi(argv[1]) : 4;
  const int nhost = argc > 2 ? std::atoi(argv[2]) : 4;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 50;
  const long n = argc > 4 ? std::atol(argv[4]) : 65536;
  const int m = argc > 5 ? std::atoi(argv[5]) : 128;
  std::vector<double*> xs(nlaunch), ys(nlaunch), mats(nlaunch), outs(nlaunch), hostbufs(nhost);
  for (int t = 0; t < nlaunch; ++t) {
    CHECK(cudaMallocManaged(&xs[t], n * sizeof(double)));
    CHECK(cudaMallocManaged(&ys[t], n * sizeof(double)));
    CHECK(cudaMallocManaged(&mats[t], size_t(m) * n * sizeof(double)));
    CHECK(cudaMallocManaged(&outs[t], n * sizeof(double)));
    for (long i = 0; i < n; ++i) xs[t][i] = 1.0 + (i % 7), ys[t][i] = t, outs[t][i] = 0;
    for (size_t i = 0; i < size_t(m) * n; ++i) mats[t][i] = double(i % 5) * 0.25;
  }
  for (int h = 0; h < nhost; ++h) {
    CHECK(cudaMallocManaged(&hostbufs[h], n * sizeof(double)));
    for (long i = 0; i < n; ++i) hostbufs[h][i] = 0;
  }
  std::atomic<int> running{nlaunch};
  std::atomic<int> failures{0};
#pragma omp parallel num_threads(nlaunch + nhost)
  {
    const int t = omp_get_thread_num();
    if (t >= nlaunch) {  // host compute on managed buffers no kernel touches
      double* buf = hostbufs[t - nlaunch];
      long iters = 0;
      while (running.load(std::memory_order_relaxed) > 0 || iters == 0) {
        for (long i = 0; i < n; ++i) buf[i] = buf[i] * 0.5 + double(i % 11);
        ++iters;
      }
    } else {
      cudaStream_t s;
      CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
#ifdef WITH_CUBLAS
      cublasHandle_t handle;
      if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) failures++;
      cublasSetStream(handle, s);
#endif
      const unsigned blocks = unsigned((n + 255) / 256);
      double check = 0;
      for (int r = 0; r < rounds; ++r) {
        axpy<<<blocks, 256, 0, s>>>(1.0, xs[t], ys[t], n);
#ifdef WITH_CUBLAS
        const double one = 1.0, zero = 0.0;
        // outs = mats (n x m, column-major, lda = n) * xs[0:m]
        if (cublasDgemv(handle, CUBLAS_OP_N, int(n), m, &one, mats[t], int(n), xs[t], 1, &zero, outs[t], 1) !=
            CUBLAS_STATUS_SUCCESS)
          failures++;
#else
        colsum<<<blocks, 256, 0, s>>>(mats[t], xs[t], outs[t], n, m);
#endif
        CHECK(cudaStreamSynchronize(s));
        check += outs[t][r % n] + ys[t][(r * 7) % n];  // the host reads managed results every round
      }
      for (long i = 0; i < n; ++i)
        if (ys[t][i] != t + rounds * (1.0 + (i % 7))) {
          failures++;
          break;
        }
      double expect = 0;
      for (int j = 0; j < m; ++j) expect += mats[t][size_t(j) * n + 1] * xs[t][j];
      if (std::fabs(outs[t][1] - expect) > 1e-9 * std::fabs(expect) || !std::isfinite(check)) failures++;
#ifdef WITH_CUBLAS
      cublasDestroy(handle);
#endif
      CHECK(cudaStreamDestroy(s));
      running--;
    }
  }
  std::printf("threads_omp: %s (%d launch threads, %d host threads, %d rounds, n=%ld, m=%d)\n",
              failures ? "FAILED" : "ok", nlaunch, nhost, rounds, n, m);
  return failures ? 1 : 0;
}
