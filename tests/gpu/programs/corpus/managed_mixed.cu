// Managed and device memory in one program, the host changing managed memory
// between launches: every kernel replays bit-exact, each from the state it saw.
#include "corpus.h"

__global__ void scale_device(float* d, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d[i] *= s;
}
__global__ void gather_into_managed(const float* dev, const int* index, float* managed_out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) managed_out[i] = dev[index[i]];
}
__global__ void accumulate_from_managed(const float* managed_in, float* dev_out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dev_out[i] += managed_in[i];
}

int main() {
    const int n = 1 << 13;
    std::vector<float> h = fill(n, -1.0f, 1.0f, 7);
    std::vector<int> idx(n);
    for (int i = 0; i < n; ++i) idx[i] = (i * 37) % n;
    float* dev = to_device(h);
    int* index = to_device(idx);
    float* acc = to_device(std::vector<float>(n, 0.0f));
    float* managed;
    CHECK(cudaMallocManaged(&managed, n * sizeof(float)));
    scale_device<<<n / 256, 256>>>(dev, 3.0f, n);
    gather_into_managed<<<n / 256, 256>>>(dev, index, managed, n);
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < n; ++i) managed[i] += 1.0f;  // the host changes it between launches
    accumulate_from_managed<<<n / 256, 256>>>(managed, acc, n);
    std::vector<float> out = to_host(acc, n);
    bool ok = true;
    for (int i = 0; i < n; ++i) ok &= out[i] == h[idx[i]] * 3.0f + 1.0f;
    return report("managed_mixed", ok, "acc != 3 * dev[index] + 1");
}
