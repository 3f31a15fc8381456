// 1-D texture objects over linear device memory (cudaResourceTypeLinear), point
// filtering, element reads with tex1Dfetch: a float texture over a range that starts
// one texture alignment (512 bytes) into its allocation, and an int texture over a whole
// allocation, both read at scattered indices by one kernel that takes both handles as
// arguments.
#include "common.h"

__global__ void gather_linear(cudaTextureObject_t values, cudaTextureObject_t weights, const int* idx, float* out,
                              int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const int k = idx[i];
        out[i] = tex1Dfetch<float>(values, k) * static_cast<float>(tex1Dfetch<int>(weights, k)) +
                 tex1Dfetch<float>(values, k + 1);
    }
}

int main() {
    const int count = 10000, n = 1 << 16;
    int alignment = 0;  // bytes; 512 on current GPUs
    CHECK(cudaDeviceGetAttribute(&alignment, cudaDevAttrTextureAlignment, 0));
    const int offset = alignment / static_cast<int>(sizeof(float));
    std::vector<float> h = fill(offset + count, -2.0f, 2.0f, 3);
    std::vector<int> w(count), idx(n);
    for (int k = 0; k < count; ++k) w[k] = (k * 37) % 11 - 5;
    for (int i = 0; i < n; ++i) idx[i] = static_cast<int>((i * 7919ll) % (count - 1));  // k + 1 stays inside
    float* buffer = to_device(h);
    int* d_w = to_device(w);
    int* d_idx = to_device(idx);
    float* out = to_device(std::vector<float>(n, 0.0f));

    cudaResourceDesc res = {};
    res.resType = cudaResourceTypeLinear;
    res.res.linear.devPtr = buffer + offset;
    res.res.linear.desc = cudaCreateChannelDesc<float>();
    res.res.linear.sizeInBytes = count * sizeof(float);
    const cudaTextureObject_t values = make_texture(res, cudaFilterModePoint, false, cudaAddressModeClamp);
    res.res.linear.devPtr = d_w;
    res.res.linear.desc = cudaCreateChannelDesc<int>();
    const cudaTextureObject_t weights = make_texture(res, cudaFilterModePoint, false, cudaAddressModeClamp);

    gather_linear<<<(n + 255) / 256, 256>>>(values, weights, d_idx, out, n);
    CHECK(cudaGetLastError());
    std::vector<float> got = to_host(out, n);
    bool ok = true;
    for (int i = 0; i < n; ++i) {
        const int k = idx[i];
        ok &= got[i] == std::fmaf(h[offset + k], static_cast<float>(w[k]), h[offset + k + 1]) ||
              got[i] == h[offset + k] * static_cast<float>(w[k]) + h[offset + k + 1];
    }
    CHECK(cudaDestroyTextureObject(values));
    CHECK(cudaDestroyTextureObject(weights));
    return report("tex1d_linear", ok, "a texture read differs from the buffer");
}
