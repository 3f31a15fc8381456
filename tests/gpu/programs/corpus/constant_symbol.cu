// __constant__ memory set from the host with cudaMemcpyToSymbol (stencil
// weights and a size), read by a kernel; a __device__ counter it bumps.
#include "corpus.h"

constexpr int kTaps = 9;
__constant__ float c_weights[kTaps];
__constant__ int c_n;
__device__ unsigned d_launches;

__global__ void stencil(const float* in, float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= c_n) return;
    float s = 0.0f;
    for (int k = 0; k < kTaps; ++k) {
        int j = min(max(i + k - kTaps / 2, 0), c_n - 1);
        s += c_weights[k] * in[j];
    }
    out[i] = s;
    if (i == 0) atomicAdd(&d_launches, 1u);
}

int main() {
    const int n = 1 << 14;
    float weights[kTaps];
    for (int k = 0; k < kTaps; ++k) weights[k] = 1.0f / (1 << (1 + (k > kTaps / 2 ? k - kTaps / 2 : kTaps / 2 - k)));
    CHECK(cudaMemcpyToSymbol(c_weights, weights, sizeof weights));
    CHECK(cudaMemcpyToSymbol(c_n, &n, sizeof n));
    std::vector<float> h = fill(n, -4.0f, 4.0f, 5);
    float* in = to_device(h);
    float* out = to_device(std::vector<float>(n, 0.0f));
    stencil<<<n / 256, 256>>>(in, out);
    std::vector<float> got = to_host(out, n);
    unsigned launches = 0;
    CHECK(cudaMemcpyFromSymbol(&launches, d_launches, sizeof launches));
    bool ok = launches == 1;
    for (int i = 0; i < n; i += 97) {
        float s = 0.0f;
        for (int k = 0; k < kTaps; ++k) s += weights[k] * h[std::min(std::max(i + k - kTaps / 2, 0), n - 1)];
        ok &= close_to(got[i], s, 1e-5f);
    }
    return report("constant_symbol", ok, "the stencil differs from the host's");
}
