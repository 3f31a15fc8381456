// N host threads, each launching on its own stream at the same time, over
// its own buffers (device memory, or managed memory with "managed"). Every
// launch of a thread has the same arguments, so recording yields one instance
// per thread (tests/gpu/test_threads.py replays each and checks it verifies:
// the snapshots around a recorded launch must not see another thread's kernel).
// The kernels run long enough to overlap across streams.
//   threads_streams [THREADS=8] [ROUNDS=4] [device|managed] [N=1048576]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "check.h"

// y[i] = f(y[i], x[i]) iterated: integer arithmetic, exact on replay.
__global__ void mix(const unsigned* x, unsigned* y, unsigned salt, int n, int iters) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned v = y[i];
  for (int k = 0; k < iters; ++k) v = v * 1664525u + (x[i] ^ salt) + unsigned(k);
  y[i] = v;
}

static unsigned host_mix(unsigned v, unsigned x, unsigned salt, int iters) {
  for (int k = 0; k < iters; ++k) v = v * 1664525u + (x ^ salt) + unsigned(k);
  return v;
}

int main(int argc, char** argv) {
  const int nthreads = argc > 1 ? std::atoi(argv[1]) : 8;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 4;
  const bool managed = argc > 3 && std::strcmp(argv[3], "managed") == 0;
  const int n = argc > 4 ? std::atoi(argv[4]) : 1 << 20;
  const int iters = 256;
  std::vector<unsigned*> xs(nthreads), ys(nthreads);
  std::vector<std::vector<unsigned>> x_host(nthreads, std::vector<unsigned>(n)), y_host(nthreads, std::vector<unsigned>(n));
  for (int t = 0; t < nthreads; ++t) {
    for (int i = 0; i < n; ++i) x_host[t][i] = unsigned(i * 2654435761u) ^ unsigned(t), y_host[t][i] = unsigned(i + t);
    if (managed) {
      CHECK(cudaMallocManaged(&xs[t], n * sizeof(unsigned)));
      CHECK(cudaMallocManaged(&ys[t], n * sizeof(unsigned)));
      std::memcpy(xs[t], x_host[t].data(), n * sizeof(unsigned));
      std::memcpy(ys[t], y_host[t].data(), n * sizeof(unsigned));
    } else {
      CHECK(cudaMalloc(&xs[t], n * sizeof(unsigned)));
      CHECK(cudaMalloc(&ys[t], n * sizeof(unsigned)));
      CHECK(cudaMemcpy(xs[t], x_host[t].data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(ys[t], y_host[t].data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
    }
  }
  CHECK(cudaDeviceSynchronize());
  std::vector<std::thread> threads;
  for (int t = 0; t < nthreads; ++t)
    threads.emplace_back([&, t] {
      cudaStream_t s;
      CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      for (int r = 0; r < rounds; ++r) mix<<<(n + 255) / 256, 256, 0, s>>>(xs[t], ys[t], 0x9e37u * unsigned(t + 1), n, iters);
      CHECK(cudaStreamSynchronize(s));
      CHECK(cudaStreamDestroy(s));
    });
  for (auto& th : threads) th.join();
  int failures = 0;
  std::vector<unsigned> got(n);
  for (int t = 0; t < nthreads; ++t) {
    if (managed) std::memcpy(got.data(), ys[t], n * sizeof(unsigned));
    else CHECK(cudaMemcpy(got.data(), ys[t], n * sizeof(unsigned), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i += 997) {
      unsigned v = y_host[t][i];
      for (int r = 0; r < rounds; ++r) v = host_mix(v, x_host[t][i], 0x9e37u * unsigned(t + 1), iters);
      if (got[i] != v) {
        failures++;
        break;
      }
    }
  }
  std::printf("threads_streams: %s (%d threads, %d rounds, %s memory)\n", failures ? "FAILED" : "ok", nthreads, rounds,
              managed ? "managed" : "device");
  return failures ? 1 : 0;
}
