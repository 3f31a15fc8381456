// Launches whose replay needs more than grid, block and argument bytes:
//   cluster_exchange  thread-block clusters given at launch time (cudaLaunchKernelEx with a
//                     cluster dimension attribute); each block reads its neighbour's shared
//                     memory, so the result depends on the cluster shape (sm_90+)
//   coop_total        a cooperative launch (cudaLaunchCooperativeKernel): grid-wide sync
//                     between a per-block reduction and its use
//   big_param         a 8 KiB struct passed by value (parameters above 4 KiB: CUDA 12.1+)
// The program checks every result on the host and prints "launch_attrs ok".
#include <cooperative_groups.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace cg = cooperative_groups;

#define CHECK(x)                                                                     \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

constexpr int kThreads = 128;

__global__ void cluster_exchange(const int* in, int* out, int n) {
  __shared__ int tile[kThreads];
  cg::cluster_group cluster = cg::this_cluster();
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = i < n ? in[i] : 0;
  cluster.sync();
  unsigned peer = (cluster.block_rank() + 1) % cluster.num_blocks();
  const int* theirs = cluster.map_shared_rank(tile, peer);
  if (i < n) out[i] = theirs[threadIdx.x] * 3 + int(cluster.block_rank()) * 1000 + int(cluster.num_blocks()) * 100000;
  cluster.sync();  // keep this block's shared memory alive until the peer has read it
}

__global__ void coop_total(const int* in, int* partial, int* out, int n) {
  cg::grid_group grid = cg::this_grid();
  __shared__ int sums[kThreads];
  int sum = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) sum += in[i];
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) sums[threadIdx.x] += sums[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sums[0];
  grid.sync();
  int total = 0;
  for (unsigned b = 0; b < gridDim.x; ++b) total += partial[b];
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = in[i] * 2 + total;
}

struct Big {
  int v[2048];  // 8192 bytes: above the 4 KiB parameter limit of CUDA < 12.1
};

__global__ void big_param(Big b, int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = b.v[(i * 7) % 2048] * 5 + i;
}

int main() {
  const int n = 4096;
  std::vector<int> host(n);
  for (int i = 0; i < n; ++i) host[i] = (i * 37) % 101 - 50;
  int *in, *out_cluster, *out_coop, *partial, *out_big;
  CHECK(cudaMalloc(&in, n * sizeof(int)));
  CHECK(cudaMalloc(&out_cluster, n * sizeof(int)));
  CHECK(cudaMalloc(&out_coop, n * sizeof(int)));
  CHECK(cudaMalloc(&out_big, n * sizeof(int)));
  CHECK(cudaMemcpy(in, host.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(out_cluster, 0, n * sizeof(int)));
  CHECK(cudaMemset(out_coop, 0, n * sizeof(int)));
  CHECK(cudaMemset(out_big, 0, n * sizeof(int)));

  // Clusters of 4 blocks along x, then (same arguments, the result checked below) of 2: two instances.
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(n / kThreads);
  cfg.blockDim = dim3(kThreads);
  cudaLaunchAttribute cluster_attr[1];
  cluster_attr[0].id = cudaLaunchAttributeClusterDimension;
  cluster_attr[0].val.clusterDim.x = 4;
  cluster_attr[0].val.clusterDim.y = 1;
  cluster_attr[0].val.clusterDim.z = 1;
  cfg.attrs = cluster_attr;
  cfg.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&cfg, cluster_exchange, (const int*)in, out_cluster, n));
  cluster_attr[0].val.clusterDim.x = 2;
  CHECK(cudaLaunchKernelEx(&cfg, cluster_exchange, (const int*)in, out_cluster, n));

  // Cooperative: a grid that is surely co-resident.
  int blocks = 8;
  CHECK(cudaMalloc(&partial, blocks * sizeof(int)));
  int nn = n;
  void* coop_args[] = {&in, &partial, &out_coop, &nn};
  CHECK(cudaLaunchCooperativeKernel((const void*)coop_total, dim3(blocks), dim3(kThreads), coop_args, 0, 0));

  Big big;
  for (int k = 0; k < 2048; ++k) big.v[k] = k * 3 - 1000;
  big_param<<<n / kThreads, kThreads>>>(big, out_big, n);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());

  std::vector<int> got(n);
  CHECK(cudaMemcpy(got.data(), out_cluster, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    int block = i / kThreads, rank = block % 2, peer_block = block - rank + (rank + 1) % 2;
    int want = host[peer_block * kThreads + i % kThreads] * 3 + rank * 1000 + 2 * 100000;
    if (got[i] != want) { std::fprintf(stderr, "cluster_exchange: out[%d] = %d, want %d\n", i, got[i], want); return 1; }
  }
  long total = 0;
  for (int i = 0; i < n; ++i) total += host[i];
  CHECK(cudaMemcpy(got.data(), out_coop, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i)
    if (got[i] != host[i] * 2 + total) { std::fprintf(stderr, "coop_total: out[%d] = %d\n", i, got[i]); return 1; }
  CHECK(cudaMemcpy(got.data(), out_big, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i)
    if (got[i] != big.v[(i * 7) % 2048] * 5 + i) { std::fprintf(stderr, "big_param: out[%d] = %d\n", i, got[i]); return 1; }
  std::printf("launch_attrs ok\n");
  return 0;
}
