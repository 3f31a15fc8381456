// Kernels of textures_app.cpp, compiled with nvcc to PTX (which the application loads, and which the
// agent reads) and to a cubin (what the fake driver hands the recorder as the module it loaded). The
// fake driver runs them on the host (fake_cuda.cpp, run_texture_kernel): point reads only.
#include <cuda_runtime.h>

// A texture over linear memory, a texture over a 16 x 8 CUDA array and a surface over another one, all
// as arguments: out[i] = linear[i] + image(i % 16, i / 16 % 8), also written into the surface's array.
__global__ void sample(cudaTextureObject_t linear, cudaTextureObject_t image, cudaSurfaceObject_t canvas, float* out,
                       int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const int x = i % 16, y = i / 16 % 8;
        const float v = tex1Dfetch<float>(linear, i) + tex2D<float>(image, x + 0.5f, y + 0.5f);
        out[i] = v;
        surf2Dwrite(v, canvas, x * static_cast<int>(sizeof(float)), y);
    }
}

// A texture whose handle is in device memory: out[i] = 2 * texture(table[0])[i].
__global__ void table(const cudaTextureObject_t* handles, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * tex1Dfetch<float>(handles[0], i);
}
