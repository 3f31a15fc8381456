// Jacobi steps of -u'' = f on a 1D grid: the new iterate is deterministic, the residual
// (sum of squared updates) is accumulated with float atomics and is not.
#include "common.h"

__global__ void jacobi_step(const float* u, float* unew, const float* f, float* residual, int n, float h2) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= 0 || i >= n - 1) return;
    float v = 0.5f * (u[i - 1] + u[i + 1] + h2 * f[i]);
    unew[i] = v;
    float d = v - u[i];
    atomicAdd(residual, d * d);
}

int main() {
    const int n = 1 << 20;
    const float h = 1.0f / (n - 1);
    float* u = to_device(fill(n, 0.0f, 1.0f, 3));
    float* unew = to_device(std::vector<float>(n, 0.0f));
    float* f = to_device(fill(n, -1.0f, 1.0f, 5));
    float* residual = nullptr;
    CHECK(cudaMalloc(&residual, sizeof(float)));
    for (int step = 0; step < 2; ++step) {
        CHECK(cudaMemset(residual, 0, sizeof(float)));
        jacobi_step<<<(n + 255) / 256, 256>>>(u, unew, f, residual, n, h * h);
        CHECK(cudaGetLastError());
        float r = 0;
        CHECK(cudaMemcpy(&r, residual, sizeof(float), cudaMemcpyDeviceToHost));
        std::printf("step %d residual %.9g\n", step, r);
        std::swap(u, unew);
    }
    return 0;
}
