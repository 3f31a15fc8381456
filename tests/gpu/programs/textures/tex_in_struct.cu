// Texture handles that are not kernel arguments: a table of samplers (a handle, a scale,
// a length) in device memory, filled with cudaMemcpy; the kernel takes only a pointer to
// the table. One sampler is over linear memory (read with tex1Dfetch), the other over a
// 1-D CUDA array (read with tex1D at texel centres, point filtering). The recorder finds
// the handles in the memory it captures, not in the arguments.
#include "common.h"

struct Sampler {
    cudaTextureObject_t tex;
    float scale;
    int length;
    int over_array;  // 1: a CUDA array (tex1D), 0: linear memory (tex1Dfetch)
    int pad;
};

__global__ void gather_through_table(const Sampler* table, int samplers, const int* idx, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const Sampler s = table[i % samplers];
        const int k = idx[i] % s.length;
        const float v = s.over_array ? tex1D<float>(s.tex, k + 0.5f) : tex1Dfetch<float>(s.tex, k);
        out[i] = s.scale * v;
    }
}

int main() {
    const int la = 5000, lb = 3000, n = 1 << 15;
    std::vector<float> ha = fill(la, 0.0f, 10.0f, 41), hb = fill(lb, -10.0f, 0.0f, 43);
    std::vector<int> idx(n);
    for (int i = 0; i < n; ++i) idx[i] = static_cast<int>((i * 104729ll) % 15000);
    float* linear = to_device(ha);
    cudaChannelFormatDesc desc = cudaCreateChannelDesc<float>();
    cudaArray_t array = nullptr;
    CHECK(cudaMallocArray(&array, &desc, lb));  // height 0: a 1-D array
    CHECK(cudaMemcpy2DToArray(array, 0, 0, hb.data(), lb * sizeof(float), lb * sizeof(float), 1,
                              cudaMemcpyHostToDevice));

    cudaResourceDesc res = {};
    res.resType = cudaResourceTypeLinear;
    res.res.linear.devPtr = linear;
    res.res.linear.desc = desc;
    res.res.linear.sizeInBytes = la * sizeof(float);
    std::vector<Sampler> table = {
        {make_texture(res, cudaFilterModePoint, false, cudaAddressModeClamp), 2.0f, la, 0, 0},
        {make_texture(array_resource(array), cudaFilterModePoint, false, cudaAddressModeClamp), -0.5f, lb, 1, 0},
    };
    Sampler* d_table = to_device(table);
    int* d_idx = to_device(idx);
    float* out = to_device(std::vector<float>(n, 0.0f));

    gather_through_table<<<(n + 255) / 256, 256>>>(d_table, static_cast<int>(table.size()), d_idx, out, n);
    CHECK(cudaGetLastError());
    std::vector<float> got = to_host(out, n);
    bool ok = true;
    for (int i = 0; i < n; ++i) {
        const Sampler& s = table[i % table.size()];
        const int k = idx[i] % s.length;
        ok &= got[i] == s.scale * (s.over_array ? hb[k] : ha[k]);
    }
    for (const Sampler& s : table) CHECK(cudaDestroyTextureObject(s.tex));
    CHECK(cudaFreeArray(array));
    return report("tex_in_struct", ok, "a read through a handle in device memory differs");
}
