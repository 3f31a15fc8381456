// A block reduction finished with float atomicAdd into one scalar: every block sums its
// elements into shared memory with atomics, then adds its partial sum to *out. The order
// of the atomics (inside a block and across blocks) changes from run to run, and so does
// the rounding of the float sum. One thread per element (no grid-stride loop): a grid
// that does not cover n drops elements.
#include "common.h"

__global__ void block_sum(const float* x, float* out, int n) {
    __shared__ float partial;
    if (threadIdx.x == 0) partial = 0.0f;
    __syncthreads();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&partial, x[i]);
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(out, partial);
}

int main() {
    const int n = 1 << 20;
    float* x = to_device(fill(n, 0.0f, 1000.0f, 7));
    float* out = nullptr;
    CHECK(cudaMalloc(&out, sizeof(float)));
    CHECK(cudaMemset(out, 0, sizeof(float)));
    block_sum<<<(n + 255) / 256, 256>>>(x, out, n);
    CHECK(cudaGetLastError());
    float sum = 0;
    CHECK(cudaMemcpy(&sum, out, sizeof(float), cudaMemcpyDeviceToHost));
    std::printf("sum %.9g\n", sum);
    return 0;
}
