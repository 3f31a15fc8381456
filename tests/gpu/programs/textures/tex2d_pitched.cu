// A 2-D texture object over pitched linear memory (cudaMallocPitch, cudaResourceTypePitch2D)
// with linear filtering and normalized coordinates, clamped at the edges: a 200 x 120
// image resampled to 256 x 160, a little beyond its edges (`resample` in common.h).
#include "common.h"

int main() {
    const int w = 200, h = 120, ow = 256, oh = 160;
    std::vector<float> img = image(w, h, 17);
    float* pitched = nullptr;
    size_t pitch = 0;
    CHECK(cudaMallocPitch(&pitched, &pitch, w * sizeof(float), h));
    CHECK(cudaMemcpy2D(pitched, pitch, img.data(), w * sizeof(float), w * sizeof(float), h, cudaMemcpyHostToDevice));
    float* out = to_device(std::vector<float>(static_cast<size_t>(ow) * oh, 0.0f));

    cudaResourceDesc res = {};
    res.resType = cudaResourceTypePitch2D;
    res.res.pitch2D.devPtr = pitched;
    res.res.pitch2D.desc = cudaCreateChannelDesc<float>();
    res.res.pitch2D.width = w;
    res.res.pitch2D.height = h;
    res.res.pitch2D.pitchInBytes = pitch;
    const cudaTextureObject_t tex = make_texture(res, cudaFilterModeLinear, true, cudaAddressModeClamp);

    resample<<<dim3((ow + 15) / 16, (oh + 15) / 16), dim3(16, 16)>>>(tex, out, ow, oh, 1.1f, -0.05f);
    CHECK(cudaGetLastError());
    std::vector<float> got = to_host(out, static_cast<size_t>(ow) * oh);
    bool ok = pitch >= w * sizeof(float);
    for (int y = 0; y < oh; ++y)
        for (int x = 0; x < ow; ++x) {
            const float2 at = sample_at(x, y, ow, oh, 1.1f, -0.05f);
            ok &= filtered_matches(got[y * ow + x], img, w, h, at.x * w, at.y * h, false);
        }
    CHECK(cudaDestroyTextureObject(tex));
    return report("tex2d_pitched", ok, "a filtered sample is off");
}
