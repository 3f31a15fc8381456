// A histogram with float weights: each element adds its weight to its bin with a float
// atomicAdd, so each bin's sum depends on the order of the atomics.
#include "common.h"

__global__ void weighted_histogram(const float* x, const float* w, float* bins, int n, int nbins) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int b = min(static_cast<int>(x[i] * nbins), nbins - 1);
    atomicAdd(&bins[b], w[i]);
}

int main() {
    const int n = 1 << 20, nbins = 64;
    float* x = to_device(fill(n, 0.0f, 1.0f, 17));
    float* w = to_device(fill(n, 0.1f, 10.0f, 19));
    float* bins = to_device(std::vector<float>(nbins, 0.0f));
    weighted_histogram<<<(n + 255) / 256, 256>>>(x, w, bins, n, nbins);
    CHECK(cudaGetLastError());
    std::vector<float> h(nbins);
    CHECK(cudaMemcpy(h.data(), bins, nbins * sizeof(float), cudaMemcpyDeviceToHost));
    std::printf("bin0 %.9g\n", h[0]);
    return 0;
}
