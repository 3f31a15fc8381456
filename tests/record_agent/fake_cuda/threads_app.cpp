// An application for the fake driver (fake_cuda.cpp): THREADS host threads,
// each on its own stream, launch the vector add (the real cubin of
// mneme.format.vecadd_code, loaded from FAKE_CUBIN) ROUNDS times over their own
// buffers, which hold the same values in every thread (so later snapshots leave
// out pieces earlier entries captured). Optionally a thread loads the module
// again and again meanwhile (each load issues the module-loaded callback with
// the driver's module-loading lock held), and host threads write managed
// buffers the whole time. Checks its results and prints one line.
//   threads_app THREADS ROUNDS [LOADS=0] [MANAGED_WRITERS=0]
#include <cuda.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#define CHECK(x)                                                              \
  do {                                                                        \
    CUresult r_ = (x);                                                        \
    if (r_ != CUDA_SUCCESS) {                                                 \
      std::fprintf(stderr, "%s:%d: CUDA error %d\n", __FILE__, __LINE__, r_); \
      std::exit(3);                                                           \
    }                                                                         \
  } while (0)

int main(int argc, char** argv) {
  const int nthreads = argc > 1 ? std::atoi(argv[1]) : 4;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 4;
  const int loads = argc > 3 ? std::atoi(argv[3]) : 0;
  const int writers = argc > 4 ? std::atoi(argv[4]) : 0;
  const int n = 4096;
  const char* cubin_path = std::getenv("FAKE_CUBIN");
  if (!cubin_path) {
    std::fprintf(stderr, "FAKE_CUBIN is not set\n");
    return 2;
  }
  std::ifstream in(cubin_path, std::ios::binary);
  std::vector<char> image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(cuInit(0));
  CUmodule module;
  CUfunction vecadd;
  CHECK(cuModuleLoadData(&module, image.data()));
  CHECK(cuModuleGetFunction(&vecadd, module, "_Z6vecaddPKfS0_Pfi"));
  std::vector<float> a(n), b(n);
  for (int i = 0; i < n; ++i) a[i] = i * 0.5f, b[i] = 2.0f - i * 0.25f;
  std::vector<CUdeviceptr> da(nthreads), db(nthreads), dc(nthreads);
  for (int t = 0; t < nthreads; ++t) {
    CHECK(cuMemAlloc(&da[t], n * sizeof(float)));
    CHECK(cuMemAlloc(&db[t], n * sizeof(float)));
    CHECK(cuMemAlloc(&dc[t], n * sizeof(float)));
    CHECK(cuMemcpyHtoD(da[t], a.data(), n * sizeof(float)));
    CHECK(cuMemcpyHtoD(db[t], b.data(), n * sizeof(float)));
    std::vector<float> zero(n, 0.0f);
    CHECK(cuMemcpyHtoD(dc[t], zero.data(), n * sizeof(float)));
  }
  std::atomic<int> running{nthreads};
  std::vector<std::thread> others;
  for (int w = 0; w < writers; ++w)
    others.emplace_back([&] {
      CUdeviceptr m;
      CHECK(cuMemAllocManaged(&m, n * sizeof(double), CU_MEM_ATTACH_GLOBAL));
      auto* p = reinterpret_cast<double*>(m);
      while (running.load() > 0)
        for (int i = 0; i < n; ++i) p[i] = p[i] * 0.5 + i;
    });
  if (loads > 0)
    others.emplace_back([&] {
      for (int k = 0; k < loads && running.load() > 0; ++k) {
        CUmodule again;
        CHECK(cuModuleLoadData(&again, image.data()));
        std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
    });
  std::vector<std::thread> launchers;
  for (int t = 0; t < nthreads; ++t)
    launchers.emplace_back([&, t] {
      CUstream s;
      CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
      int count = n;
      void* params[] = {&da[t], &db[t], &dc[t], &count};
      for (int r = 0; r < rounds; ++r) CHECK(cuLaunchKernel(vecadd, (n + 255) / 256, 1, 1, 256, 1, 1, 0, s, params, nullptr));
      CHECK(cuStreamSynchronize(s));
      running--;
    });
  for (auto& th : launchers) th.join();
  for (auto& th : others) th.join();
  int bad = 0;
  std::vector<float> c(n);
  for (int t = 0; t < nthreads; ++t) {
    CHECK(cuMemcpyDtoH(c.data(), dc[t], n * sizeof(float)));
    for (int i = 0; i < n; ++i) bad += c[i] != a[i] + b[i];
  }
  std::printf("threads_app: %s (%d threads, %d rounds)\n", bad ? "FAILED" : "ok", nthreads, rounds);
  return bad ? 1 : 0;
}
