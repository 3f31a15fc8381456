// Dynamic shared memory: a block-wide inclusive scan in `extern __shared__`
// sized at launch, and a tile transpose that asks for more than the default
// 48 KiB (cudaFuncSetAttribute: the replay must make the same opt-in).
#include "corpus.h"

__global__ void block_scan(const int* in, int* out, int n) {
    extern __shared__ int buf[];  // 2 * blockDim.x ints: double-buffered Hillis-Steele
    int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    int* a = buf;
    int* b = buf + blockDim.x;
    a[t] = i < n ? in[i] : 0;
    __syncthreads();
    for (int d = 1; d < blockDim.x; d <<= 1) {
        b[t] = a[t] + (t >= d ? a[t - d] : 0);
        __syncthreads();
        int* tmp = a; a = b; b = tmp;
    }
    if (i < n) out[i] = a[t];
}

constexpr int kTile = 128;
__global__ void big_tile_reverse(const float* in, float* out, int n) {
    extern __shared__ float tile[];  // kTile * kTile floats: 64 KiB
    int base = blockIdx.x * kTile * kTile;
    for (int k = threadIdx.x; k < kTile * kTile; k += blockDim.x)
        tile[k] = base + k < n ? in[base + k] : 0.0f;
    __syncthreads();
    for (int k = threadIdx.x; k < kTile * kTile; k += blockDim.x)
        if (base + k < n) out[base + k] = tile[kTile * kTile - 1 - k];
}

int main() {
    const int n = 1 << 14, threads = 256;
    std::vector<int> h(n);
    for (int i = 0; i < n; ++i) h[i] = (i * 13) % 17 - 8;
    int* in = to_device(h);
    int* out = to_device(std::vector<int>(n, 0));
    block_scan<<<n / threads, threads, 2 * threads * sizeof(int)>>>(in, out, n);

    const int big = 4 * kTile * kTile;
    const size_t shared = kTile * kTile * sizeof(float);
    CHECK(cudaFuncSetAttribute(big_tile_reverse, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    std::vector<float> hf = fill(big, 0.0f, 1.0f, 9);
    float* fin = to_device(hf);
    float* fout = to_device(std::vector<float>(big, 0.0f));
    big_tile_reverse<<<big / (kTile * kTile), 512, shared>>>(fin, fout, big);

    std::vector<int> got = to_host(out, n);
    bool ok = true;
    for (int b = 0; b < n / threads; ++b) {
        int s = 0;
        for (int t = 0; t < threads; ++t) ok &= got[b * threads + t] == (s += h[b * threads + t]);
    }
    std::vector<float> gf = to_host(fout, big);
    for (int i = 0; i < big; ++i) {
        int tile = i / (kTile * kTile), k = i % (kTile * kTile);
        ok &= gf[i] == hf[tile * kTile * kTile + kTile * kTile - 1 - k];
    }
    return report("dynamic_shared", ok, "scan or tile reverse differs from the host's");
}
