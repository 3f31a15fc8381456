// Two texture objects over one 2-D CUDA array (cudaMallocArray + cudaMemcpy2DToArray):
// point filtering with unnormalized coordinates and clamp addressing, read 8 texels past
// every edge; and linear filtering with normalized coordinates and wrap addressing, read
// over [-0.25, 1.25) in both directions (`resample` in common.h). One kernel each.
#include "common.h"

constexpr int kMargin = 8;

__global__ void sample_point_clamp(cudaTextureObject_t tex, float* out, int ow, int oh) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < ow && y < oh) out[y * ow + x] = tex2D<float>(tex, x - kMargin + 0.5f, y - kMargin + 0.5f);
}

int main() {
    const int w = 64, h = 48;
    std::vector<float> img = image(w, h, 29);
    cudaChannelFormatDesc desc = cudaCreateChannelDesc<float>();
    cudaArray_t array = nullptr;
    CHECK(cudaMallocArray(&array, &desc, w, h));
    CHECK(cudaMemcpy2DToArray(array, 0, 0, img.data(), w * sizeof(float), w * sizeof(float), h,
                              cudaMemcpyHostToDevice));
    const cudaTextureObject_t point = make_texture(array_resource(array), cudaFilterModePoint, false,
                                                   cudaAddressModeClamp);
    const cudaTextureObject_t linear = make_texture(array_resource(array), cudaFilterModeLinear, true,
                                                    cudaAddressModeWrap);

    const int pw = w + 2 * kMargin, ph = h + 2 * kMargin, lw = 96, lh = 80;
    float* a = to_device(std::vector<float>(static_cast<size_t>(pw) * ph, 0.0f));
    float* b = to_device(std::vector<float>(static_cast<size_t>(lw) * lh, 0.0f));
    const dim3 block(16, 16);
    sample_point_clamp<<<dim3((pw + 15) / 16, (ph + 15) / 16), block>>>(point, a, pw, ph);
    resample<<<dim3((lw + 15) / 16, (lh + 15) / 16), block>>>(linear, b, lw, lh, 1.5f, -0.25f);
    CHECK(cudaGetLastError());

    std::vector<float> ga = to_host(a, static_cast<size_t>(pw) * ph), gb = to_host(b, static_cast<size_t>(lw) * lh);
    bool ok = true;
    for (int y = 0; y < ph; ++y)
        for (int x = 0; x < pw; ++x) {
            const int tx = std::min(std::max(x - kMargin, 0), w - 1), ty = std::min(std::max(y - kMargin, 0), h - 1);
            ok &= ga[y * pw + x] == img[ty * w + tx];
        }
    for (int y = 0; y < lh; ++y)
        for (int x = 0; x < lw; ++x) {
            const float2 at = sample_at(x, y, lw, lh, 1.5f, -0.25f);
            ok &= filtered_matches(gb[y * lw + x], img, w, h, at.x * w, at.y * h, true);
        }
    CHECK(cudaDestroyTextureObject(point));
    CHECK(cudaDestroyTextureObject(linear));
    CHECK(cudaFreeArray(array));
    return report("tex2d_array", ok, "a point or a filtered sample is off");
}
