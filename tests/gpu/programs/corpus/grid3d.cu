// A 3-D grid of 3-D blocks: a 7-point Laplacian over a 64 x 32 x 16 volume.
#include "corpus.h"

__global__ void laplace3d(const float* u, float* out, int nx, int ny, int nz) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    int z = blockIdx.z * blockDim.z + threadIdx.z;
    if (x >= nx || y >= ny || z >= nz) return;
    auto at = [&](int i, int j, int k) {
        i = min(max(i, 0), nx - 1); j = min(max(j, 0), ny - 1); k = min(max(k, 0), nz - 1);
        return u[(k * ny + j) * nx + i];
    };
    out[(z * ny + y) * nx + x] = at(x - 1, y, z) + at(x + 1, y, z) + at(x, y - 1, z) + at(x, y + 1, z) +
                                 at(x, y, z - 1) + at(x, y, z + 1) - 6.0f * at(x, y, z);
}

int main() {
    const int nx = 64, ny = 32, nz = 16, n = nx * ny * nz;
    std::vector<float> h(n);
    for (int k = 0; k < nz; ++k)
        for (int j = 0; j < ny; ++j)
            for (int i = 0; i < nx; ++i) h[(k * ny + j) * nx + i] = float(i * i + 2 * j * j + 3 * k * k);
    float* u = to_device(h);
    float* out = to_device(std::vector<float>(n, 0.0f));
    dim3 block(8, 4, 4), grid(nx / 8, ny / 4, nz / 4);
    laplace3d<<<grid, block>>>(u, out, nx, ny, nz);
    std::vector<float> got = to_host(out, n);
    bool ok = true;  // interior: the Laplacian of x^2 + 2y^2 + 3z^2 is 2 + 4 + 6
    for (int k = 1; k < nz - 1; ++k)
        for (int j = 1; j < ny - 1; ++j)
            for (int i = 1; i < nx - 1; ++i) ok &= got[(k * ny + j) * nx + i] == 12.0f;
    return report("grid3d", ok, "the interior Laplacian is not 12");
}
