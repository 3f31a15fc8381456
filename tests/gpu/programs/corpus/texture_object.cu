// A kernel reading through a texture object over linear memory beside a kernel on the
// same buffer without one: both replay verified (the recorder captures the texture object
// and the memory behind it; the replay recreates it). More: ../textures/.
#include "corpus.h"

__global__ void fetch_texture(cudaTextureObject_t tex, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex1Dfetch<float>(tex, i) * 2.0f;
}
__global__ void plain_copy_scaled(const float* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * 3.0f;
}

int main() {
    const int n = 4096;
    std::vector<float> h = fill(n, -1.0f, 1.0f, 8);
    float* in = to_device(h);
    float* a = to_device(std::vector<float>(n, 0.0f));
    float* b = to_device(std::vector<float>(n, 0.0f));
    cudaResourceDesc res = {};
    res.resType = cudaResourceTypeLinear;
    res.res.linear.devPtr = in;
    res.res.linear.desc = cudaCreateChannelDesc<float>();
    res.res.linear.sizeInBytes = n * sizeof(float);
    cudaTextureDesc td = {};
    td.readMode = cudaReadModeElementType;
    cudaTextureObject_t tex;
    CHECK(cudaCreateTextureObject(&tex, &res, &td, nullptr));
    fetch_texture<<<n / 256, 256>>>(tex, a, n);
    plain_copy_scaled<<<n / 256, 256>>>(in, b, n);
    std::vector<float> ga = to_host(a, n), gb = to_host(b, n);
    bool ok = true;
    for (int i = 0; i < n; ++i) ok &= ga[i] == h[i] * 2.0f && gb[i] == h[i] * 3.0f;
    CHECK(cudaDestroyTextureObject(tex));
    return report("texture_object", ok, "a texture or plain read differs");
}
