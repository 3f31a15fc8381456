// Shared by the texture and surface programs (tests/gpu/test_textures.py): the corpus's
// error check, fill, upload, download and one-line report, a texture object from a
// resource and the usual descriptor fields, and a host reference of linear filtering.
#pragma once
#include "../corpus/corpus.h"

inline cudaTextureObject_t make_texture(const cudaResourceDesc& res, cudaTextureFilterMode filter, bool normalized,
                                        cudaTextureAddressMode address) {
    cudaTextureDesc td = {};
    td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = address;
    td.filterMode = filter;
    td.readMode = cudaReadModeElementType;
    td.normalizedCoords = normalized ? 1 : 0;
    cudaTextureObject_t tex = 0;
    CHECK(cudaCreateTextureObject(&tex, &res, &td, nullptr));
    return tex;
}

// Where output pixel (x, y) of an ow x oh image samples a texture in normalized coordinates: the image covers
// [shift, shift + scale) of the texture in both directions.
__host__ __device__ inline float2 sample_at(int x, int y, int ow, int oh, float scale, float shift) {
    return make_float2((x + 0.5f) / ow * scale + shift, (y + 0.5f) / oh * scale + shift);
}

// A texture read with normalized coordinates (and the filtering and addressing of its descriptor) onto an
// ow x oh image.
__global__ void resample(cudaTextureObject_t tex, float* out, int ow, int oh, float scale, float shift) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < ow && y < oh) {
        const float2 at = sample_at(x, y, ow, oh, scale, shift);
        out[y * ow + x] = tex2D<float>(tex, at.x, at.y);
    }
}

inline cudaResourceDesc array_resource(cudaArray_t array) {
    cudaResourceDesc res = {};
    res.resType = cudaResourceTypeArray;
    res.res.array.array = array;
    return res;
}

// A w x h float image of smooth values with some texel-to-texel variation.
inline std::vector<float> image(int w, int h, unsigned seed) {
    std::vector<float> noise = fill(static_cast<size_t>(w) * h, -0.25f, 0.25f, seed), img(noise.size());
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) img[y * w + x] = std::sin(0.11f * x) + std::cos(0.07f * y) + noise[y * w + x];
    return img;
}

// What linear filtering of a w x h float texture gives at texel coordinates (x, y) (unnormalized: a
// normalized coordinate times the extent), with clamp or wrap addressing, and how far the hardware may
// be from it: the weights are 9-bit fixed point (8 fractional bits), so each may be off by up to 1/256;
// the bound allows for both axes and for the coordinate's own rounding.
struct Filtered {
    float value;
    float bound;
};
inline Filtered linear_reference(const std::vector<float>& img, int w, int h, float x, float y, bool wrap) {
    const float xb = x - 0.5f, yb = y - 0.5f;
    const int i = static_cast<int>(std::floor(xb)), j = static_cast<int>(std::floor(yb));
    const float a = xb - std::floor(xb), b = yb - std::floor(yb);
    auto at = [&](int xi, int yi) {
        xi = wrap ? ((xi % w) + w) % w : (xi < 0 ? 0 : (xi >= w ? w - 1 : xi));
        yi = wrap ? ((yi % h) + h) % h : (yi < 0 ? 0 : (yi >= h ? h - 1 : yi));
        return img[static_cast<size_t>(yi) * w + xi];
    };
    const float t00 = at(i, j), t10 = at(i + 1, j), t01 = at(i, j + 1), t11 = at(i + 1, j + 1);
    const float value = (1 - a) * (1 - b) * t00 + a * (1 - b) * t10 + (1 - a) * b * t01 + a * b * t11;
    const float lo = std::fmin(std::fmin(t00, t10), std::fmin(t01, t11));
    const float hi = std::fmax(std::fmax(t00, t10), std::fmax(t01, t11));
    return {value, (hi - lo) * (3.0f / 256.0f) + 1e-5f};
}

// Whether `got` is linear filtering at (x, y) as above. Under clamp addressing a coordinate past the
// last texel may be clamped as a texel index (the edge texel's value) or as a coordinate (to N - 1):
// either is taken (the check is of the program, not of the hardware's edge rule).
inline bool filtered_matches(float got, const std::vector<float>& img, int w, int h, float x, float y, bool wrap) {
    const Filtered index_clamped = linear_reference(img, w, h, x, y, wrap);
    if (std::fabs(got - index_clamped.value) <= index_clamped.bound) return true;
    if (wrap) return false;
    const Filtered coordinate_clamped = linear_reference(img, w, h, std::fmin(std::fmax(x, 0.0f), w - 1.0f),
                                                         std::fmin(std::fmax(y, 0.0f), h - 1.0f), false);
    return std::fabs(got - coordinate_clamped.value) <= coordinate_clamped.bound;
}
