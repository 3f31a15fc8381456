// CUDA graphs with several kernel nodes: one captured from a stream
// (cap_scale -> cap_shift -> cap_square), one built explicitly with
// cudaGraphAddKernelNode (exp_fill -> exp_axpy), each launched with
// cudaGraphLaunch; beside them, direct launches (direct_sum, and cap_scale once
// before the capture, as a warm-up). Today the recorder records the direct
// launches only; the graph launches are not recorded (a warning says so).
#include "corpus.h"

__global__ void cap_scale(float* v, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] *= s;
}
__global__ void cap_shift(float* v, float d, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] += d;
}
__global__ void cap_square(float* v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = v[i] * v[i];
}
__global__ void exp_fill(float* v, float value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = value + i;
}
__global__ void exp_axpy(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
__global__ void direct_sum(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

int main() {
    const int n = 4096, threads = 256, blocks = n / threads;
    std::vector<float> h = fill(n, 0.0f, 2.0f, 11);
    float* v = to_device(h);
    float* x = to_device(std::vector<float>(n, 0.0f));
    float* y = to_device(std::vector<float>(n, 1.0f));
    float* out = to_device(std::vector<float>(n, 0.0f));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));

    cap_scale<<<blocks, threads, 0, s>>>(v, 0.5f, n);  // direct: recorded
    cudaGraph_t captured;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cap_scale<<<blocks, threads, 0, s>>>(v, 2.0f, n);
    cap_shift<<<blocks, threads, 0, s>>>(v, 1.0f, n);
    cap_square<<<blocks, threads, 0, s>>>(v, n);
    CHECK(cudaStreamEndCapture(s, &captured));
    cudaGraphExec_t captured_exec;
    CHECK(cudaGraphInstantiate(&captured_exec, captured, 0));
    CHECK(cudaGraphLaunch(captured_exec, s));

    cudaGraph_t built;
    CHECK(cudaGraphCreate(&built, 0));
    float fill_value = 3.0f, a = 0.25f;
    int count = n;
    void* fill_args[] = {&x, &fill_value, &count};
    void* axpy_args[] = {&x, &y, &a, &count};
    cudaKernelNodeParams p = {};
    p.gridDim = dim3(blocks);
    p.blockDim = dim3(threads);
    p.func = reinterpret_cast<void*>(exp_fill);
    p.kernelParams = fill_args;
    cudaGraphNode_t fill_node, axpy_node;
    CHECK(cudaGraphAddKernelNode(&fill_node, built, nullptr, 0, &p));
    p.func = reinterpret_cast<void*>(exp_axpy);
    p.kernelParams = axpy_args;
    CHECK(cudaGraphAddKernelNode(&axpy_node, built, &fill_node, 1, &p));
    cudaGraphExec_t built_exec;
    CHECK(cudaGraphInstantiate(&built_exec, built, 0));
    CHECK(cudaGraphLaunch(built_exec, s));
    CHECK(cudaStreamSynchronize(s));

    direct_sum<<<blocks, threads, 0, s>>>(v, y, out, n);  // direct: recorded
    std::vector<float> got = to_host(out, n);
    bool ok = true;
    for (int i = 0; i < n; ++i) {
        float vi = h[i] * 0.5f * 2.0f + 1.0f;
        float yi = 1.0f + 0.25f * (3.0f + i);
        ok &= got[i] == vi * vi + yi;
    }
    return report("graphs", ok, "the graphs' results differ from the host's");
}
