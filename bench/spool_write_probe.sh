#!/usr/bin/env bash
# Spool write ceilings of this machine, for the snapshot design of the recorder
# (docs/recording.md, "Cost"): GB/s of writing 6 GB from pinned 16 MiB buffers
# with 1-16 threads (one file each), through the page cache and with O_DIRECT,
# into $TMPDIR's filesystem and /dev/shm; and what pinning host memory costs
# (cudaMallocHost, mmap + cudaHostRegister). Needs nvcc and a GPU.
#
#   bash bench/spool_write_probe.sh
set -u
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT; cd "$W"
TMP=${TMPDIR:-/tmp}
df -T "$TMP" /dev/shm | cat
cat > wprobe.cu <<'X'
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>
#include <sys/mman.h>
#include <thread>
#include <vector>
#include <string>
#include <chrono>
#include <cuda.h>
static double now(){return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();}
int main(int argc, char** argv) {
  if (!strcmp(argv[1], "alloc")) {
    cudaFree(0);
    size_t n = 1ull << 30;
    double t0 = now(); void* p; cudaMallocHost(&p, n); double t1 = now();
    printf("cudaMallocHost 1GiB: %.1f ms (%.1f GB/s)\n", 1e3*(t1-t0), n/(t1-t0)/1e9);
    t0 = now(); void* q = mmap(nullptr, n, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_POPULATE, -1, 0); t1 = now();
    cudaHostRegister(q, n, cudaHostRegisterPortable); double t2 = now();
    printf("mmap+populate 1GiB: %.1f ms; cudaHostRegister: %.1f ms (%.1f GB/s)\n", 1e3*(t1-t0), 1e3*(t2-t1), n/(t2-t1)/1e9);
    t0 = now(); void* r = mmap(nullptr, n, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0); cudaHostRegister(r, n, cudaHostRegisterPortable); t1 = now();
    printf("mmap+register unpopulated 1GiB: %.1f ms\n", 1e3*(t1-t0));
    t0 = now(); for (int i = 0; i < 16; ++i) { void* s; cudaMallocHost(&s, 16 << 20);} t1 = now();
    printf("16 x cudaMallocHost 16MiB: %.1f ms\n", 1e3*(t1-t0));
    char* d; cudaMalloc(&d, n); cudaMemset(d, 1, n); cudaDeviceSynchronize();
    for (int rep = 0; rep < 2; ++rep) { t0 = now(); cudaMemcpy(q, d, n, cudaMemcpyDeviceToHost); t1 = now(); }
    printf("D2H 1GiB into registered: %.1f GB/s\n", n/(t1-t0)/1e9);
    return 0;
  }
  const char* dir = argv[1]; int threads = atoi(argv[2]); int direct = atoi(argv[3]); size_t total = strtoull(argv[4], 0, 0);
  size_t chunk = 16 << 20;
  std::vector<char*> bufs(threads);
  for (int t = 0; t < threads; ++t) cudaMallocHost((void**)&bufs[t], chunk), memset(bufs[t], t + 1, chunk);
  std::vector<std::thread> th; std::vector<int> bad(threads, 0);
  double t0 = now();
  for (int t = 0; t < threads; ++t) th.emplace_back([&, t] {
    std::string path = std::string(dir) + "/wp." + std::to_string(t);
    int fd = open(path.c_str(), O_WRONLY|O_CREAT|O_TRUNC|(direct ? O_DIRECT : 0), 0644);
    if (fd < 0) { bad[t] = 1; return; }
    size_t mine = total / threads;
    for (size_t off = 0; off < mine; off += chunk) if (pwrite(fd, bufs[t], chunk, off) != (ssize_t)chunk) { bad[t] = 2; break; }
    close(fd);
  });
  for (auto& x : th) x.join();
  double t1 = now();
  int b = 0; for (int x : bad) b |= x;
  printf("write %s threads=%d %s: %.2f GB/s%s\n", dir, threads, direct ? "O_DIRECT" : "buffered", total/(t1-t0)/1e9, b ? " (FAILED)" : "");
  for (int t = 0; t < threads; ++t) unlink((std::string(dir) + "/wp." + std::to_string(t)).c_str());
  return 0;
}
X
nvcc -O2 -o wprobe wprobe.cu || exit 1
./wprobe alloc
for d in "$TMP" /dev/shm; do for dio in 0 1; do for t in 1 4 8 12 16; do ./wprobe "$d" $t $dio $((6<<30)); done; done; done
