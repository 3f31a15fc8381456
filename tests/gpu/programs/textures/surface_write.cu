// Surface objects over CUDA arrays (cudaArraySurfaceLoadStore): one kernel writes an image
// into an array with surf2Dwrite; a second reads it back through another surface object
// with surf2Dread (clamped at the edges) and writes a 3-tap blur into a second array. The
// host reads both arrays back (cudaMemcpy2DFromArray).
#include "common.h"

__device__ __host__ inline float pattern(int x, int y) { return static_cast<float>((x * 3 + y * 7) % 23) - 11.0f; }

__global__ void write_surface(cudaSurfaceObject_t surf, int w, int h) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) surf2Dwrite(pattern(x, y), surf, x * static_cast<int>(sizeof(float)), y);
}

__global__ void blur_surface(cudaSurfaceObject_t in, cudaSurfaceObject_t out, int w, int h) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) {
        const int b = static_cast<int>(sizeof(float));
        const float l = surf2Dread<float>(in, (x - 1) * b, y, cudaBoundaryModeClamp);
        const float c = surf2Dread<float>(in, x * b, y, cudaBoundaryModeClamp);
        const float r = surf2Dread<float>(in, (x + 1) * b, y, cudaBoundaryModeClamp);
        surf2Dwrite((l + c + r) / 3.0f, out, x * b, y);
    }
}

cudaSurfaceObject_t surface_over(cudaArray_t array) {
    const cudaResourceDesc res = array_resource(array);
    cudaSurfaceObject_t surf = 0;
    CHECK(cudaCreateSurfaceObject(&surf, &res));
    return surf;
}

int main() {
    const int w = 256, h = 128;
    cudaChannelFormatDesc desc = cudaCreateChannelDesc<float>();
    cudaArray_t first = nullptr, second = nullptr;
    CHECK(cudaMallocArray(&first, &desc, w, h, cudaArraySurfaceLoadStore));
    CHECK(cudaMallocArray(&second, &desc, w, h, cudaArraySurfaceLoadStore));
    const std::vector<float> zeros(static_cast<size_t>(w) * h, 0.0f);
    for (cudaArray_t a : {first, second})
        CHECK(cudaMemcpy2DToArray(a, 0, 0, zeros.data(), w * sizeof(float), w * sizeof(float), h,
                                  cudaMemcpyHostToDevice));
    const cudaSurfaceObject_t s1 = surface_over(first), s2 = surface_over(second);

    const dim3 block(32, 8), grid((w + 31) / 32, (h + 7) / 8);
    write_surface<<<grid, block>>>(s1, w, h);
    blur_surface<<<grid, block>>>(s1, s2, w, h);
    CHECK(cudaGetLastError());

    std::vector<float> g1(static_cast<size_t>(w) * h), g2(g1.size());
    CHECK(cudaMemcpy2DFromArray(g1.data(), w * sizeof(float), first, 0, 0, w * sizeof(float), h,
                                cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy2DFromArray(g2.data(), w * sizeof(float), second, 0, 0, w * sizeof(float), h,
                                cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            const float l = pattern(std::max(x - 1, 0), y), c = pattern(x, y), r = pattern(std::min(x + 1, w - 1), y);
            ok &= g1[y * w + x] == c && g2[y * w + x] == (l + c + r) / 3.0f;
        }
    CHECK(cudaDestroySurfaceObject(s1));
    CHECK(cudaDestroySurfaceObject(s2));
    return report("surface_write", ok, "a surface write or read differs");
}
