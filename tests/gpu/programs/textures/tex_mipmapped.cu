// A texture object over a mipmapped array (cudaMallocMipmappedArray, three levels of
// 64x64, 32x32 and 16x16 floats, each filled through cudaGetMipmappedArrayLevel), read
// with tex2DLod at every texel centre of every level (point filtering). A recording cannot
// recreate a mipmapped array faithfully: its launch must stay refused, by name.
#include "common.h"

constexpr int kLevels = 3, kSize = 64;

__host__ __device__ inline int level_size(int level) { return kSize >> level; }
__host__ __device__ inline int level_offset(int level) {  // where a level's texels start in `out`
    int offset = 0;
    for (int l = 0; l < level; ++l) offset += level_size(l) * level_size(l);
    return offset;
}
inline float texel(int level, int x, int y) { return 1000.0f * level + y * level_size(level) + x; }

__global__ void read_levels(cudaTextureObject_t tex, float* out) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    for (int level = 0; level < kLevels; ++level) {
        const int size = level_size(level);
        if (x < size && y < size)
            out[level_offset(level) + y * size + x] =
                tex2DLod<float>(tex, (x + 0.5f) / size, (y + 0.5f) / size, static_cast<float>(level));
    }
}

int main() {
    cudaChannelFormatDesc desc = cudaCreateChannelDesc<float>();
    cudaMipmappedArray_t mip = nullptr;
    CHECK(cudaMallocMipmappedArray(&mip, &desc, make_cudaExtent(kSize, kSize, 0), kLevels));
    for (int level = 0; level < kLevels; ++level) {
        const int size = level_size(level);
        std::vector<float> h(static_cast<size_t>(size) * size);
        for (int y = 0; y < size; ++y)
            for (int x = 0; x < size; ++x) h[y * size + x] = texel(level, x, y);
        cudaArray_t array = nullptr;
        CHECK(cudaGetMipmappedArrayLevel(&array, mip, level));
        CHECK(cudaMemcpy2DToArray(array, 0, 0, h.data(), size * sizeof(float), size * sizeof(float), size,
                                  cudaMemcpyHostToDevice));
    }
    cudaResourceDesc res = {};
    res.resType = cudaResourceTypeMipmappedArray;
    res.res.mipmap.mipmap = mip;
    cudaTextureDesc td = {};
    td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
    td.filterMode = cudaFilterModePoint;
    td.mipmapFilterMode = cudaFilterModePoint;
    td.readMode = cudaReadModeElementType;
    td.normalizedCoords = 1;
    td.minMipmapLevelClamp = 0.0f;
    td.maxMipmapLevelClamp = static_cast<float>(kLevels - 1);
    cudaTextureObject_t tex = 0;
    CHECK(cudaCreateTextureObject(&tex, &res, &td, nullptr));

    const int total = level_offset(kLevels);
    float* out = to_device(std::vector<float>(total, -1.0f));
    read_levels<<<dim3(kSize / 16, kSize / 16), dim3(16, 16)>>>(tex, out);
    CHECK(cudaGetLastError());
    std::vector<float> got = to_host(out, total);
    bool ok = true;
    for (int level = 0; level < kLevels; ++level) {
        const int size = level_size(level);
        for (int y = 0; y < size; ++y)
            for (int x = 0; x < size; ++x) ok &= got[level_offset(level) + y * size + x] == texel(level, x, y);
    }
    CHECK(cudaDestroyTextureObject(tex));
    CHECK(cudaFreeMipmappedArray(mip));
    return report("tex_mipmapped", ok, "a level's texel differs");
}
