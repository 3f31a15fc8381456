// Managed memory alone (cudaMallocManaged, touched by the host before and after):
// the recorder captures the managed buffers (written by the host before the
// launch) and the replay maps device memory at their addresses.
#include "corpus.h"

__global__ void saxpy_managed(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

int main() {
    const int n = 1 << 14;
    float *x, *y;
    CHECK(cudaMallocManaged(&x, n * sizeof(float)));
    CHECK(cudaMallocManaged(&y, n * sizeof(float)));
    for (int i = 0; i < n; ++i) { x[i] = 0.5f * i; y[i] = 1.0f; }
    saxpy_managed<<<n / 256, 256>>>(2.0f, x, y, n);
    CHECK(cudaDeviceSynchronize());
    bool ok = true;
    for (int i = 0; i < n; ++i) ok &= y[i] == 2.0f * (0.5f * i) + 1.0f;
    return report("managed_alone", ok, "y != 2x + 1");
}
