// Stream compaction with an atomic index: every element that passes the predicate is
// written at the next free slot. Which element lands where depends on the order of the
// atomics: the output is a permutation that changes run to run; the count does not.
#include "common.h"

__global__ void compact(const int* in, int* out, int* count, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && in[i] % 3 == 0) out[atomicAdd(count, 1)] = in[i];
}

int main() {
    const int n = 1 << 20;
    std::vector<int> h(n);
    for (int i = 0; i < n; ++i) h[i] = static_cast<int>((i * 7919ll) % n);  // distinct values, scrambled
    int* in = to_device(h);
    int* out = to_device(std::vector<int>(n, 0));
    int* count = to_device(std::vector<int>(1, 0));
    compact<<<(n + 255) / 256, 256>>>(in, out, count, n);
    CHECK(cudaGetLastError());
    int c = 0;
    CHECK(cudaMemcpy(&c, count, sizeof(int), cudaMemcpyDeviceToHost));
    std::printf("kept %d\n", c);
    return 0;
}
