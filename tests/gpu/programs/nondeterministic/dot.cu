// A grid-wide dot product: each warp reduces its products with shuffles, lane 0 adds the
// warp's sum to *out with a float atomicAdd (order, hence rounding, varies run to run).
#include "common.h"

__global__ void dot(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? a[i] * b[i] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, v);
}

int main() {
    const int n = 1 << 20;
    float* a = to_device(fill(n, 0.0f, 2.0f, 11));
    float* b = to_device(fill(n, 0.5f, 3.0f, 13));
    float* out = nullptr;
    CHECK(cudaMalloc(&out, sizeof(float)));
    CHECK(cudaMemset(out, 0, sizeof(float)));
    dot<<<(n + 255) / 256, 256>>>(a, b, out, n);
    CHECK(cudaGetLastError());
    float r = 0;
    CHECK(cudaMemcpy(&r, out, sizeof(float), cudaMemcpyDeviceToHost));
    std::printf("dot %.9g\n", r);
    return 0;
}
