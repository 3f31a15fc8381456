// Kernels of the synthetic recordings the replay tests use (tests/replay/synthetic_recordings.py).
// Regenerate the checked-in PTX and cubin with:  make -C tests/replay/data
#include <cuda_runtime.h>

// In place and atomic: x = x * alpha + y, and every thread that did it counts itself.
extern "C" __global__ void axpy_count(float* x, const float* y, float alpha, int n, unsigned* counter) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    x[i] = x[i] * alpha + y[i];
    atomicAdd(counter, 1u);
  }
}

// Module globals: reads a table, counts hits in another global.
__device__ int g_scale[4];
__device__ unsigned g_hits;
extern "C" __global__ void scale_by_global(int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    out[i] = i * g_scale[i & 3];
    atomicAdd(&g_hits, 1u);
  }
}

// Pointers in memory: each node names the buffer it reads (relocation must follow them).
struct Node {
  const float* data;
  int count;
  int pad;
};
extern "C" __global__ void gather_sum(const Node* nodes, int n_nodes, float* out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n_nodes) {
    float s = 0.0f;
    for (int k = 0; k < nodes[i].count; ++k) s += nodes[i].data[k];
    out[i] = s;
  }
}

// Never finishes while *flag is 0: a hanging kernel for the replay timeout test.
extern "C" __global__ void hang_until(volatile int* flag) {
  while (*flag == 0) {
  }
}
