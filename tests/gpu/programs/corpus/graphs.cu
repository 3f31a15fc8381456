// CUDA graphs with several kinds of node, each graph launched twice with
// cudaGraphLaunch: one captured from a stream (cap_scale -> cap_shift ->
// cap_square), one built explicitly: a memset node, kernel nodes added with
// cudaGraphAddKernelNode (exp_fill -> exp_axpy), a child graph node (holding
// child_offset), a kernel node built from a CUkernel through the driver's
// cuGraphAddKernelNode (exp_halve), exp_count reading the memset's buffer, and
// a host node counting its calls. Beside them, direct launches (direct_sum, and
// cap_scale once before the capture, as a warm-up). The recorder records the
// graphs' kernel nodes one by one at the first launch of each graph (the second
// is all duplicates and runs as a graph); the program prints its results'
// checksum, which recording must not change.
#include <cuda.h>  // the driver API's types only: its entry point comes through cudart

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
__global__ void child_offset(float* v, float d, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] += d;
}
__global__ void exp_halve(float* v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] *= 0.5f;
}
__global__ void exp_count(const int* z, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += float(z[i]);
}
__global__ void direct_sum(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

void CUDART_CB count_call(void* calls) { ++*static_cast<int*>(calls); }

using AddKernelNode = CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const CUDA_KERNEL_NODE_PARAMS*);

int main() {
    const int n = 4096, threads = 256, blocks = n / threads, launches = 2;
    std::vector<float> h = fill(n, 0.0f, 2.0f, 11);
    float* v = to_device(h);
    float* x = to_device(std::vector<float>(n, 0.0f));
    float* y = to_device(std::vector<float>(n, 1.0f));
    float* out = to_device(std::vector<float>(n, 0.0f));
    int* z = nullptr;
    CHECK(cudaMalloc(&z, n * sizeof(int)));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));

    cap_scale<<<blocks, threads, 0, s>>>(v, 0.5f, n);  // direct
    cudaGraph_t captured;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cap_scale<<<blocks, threads, 0, s>>>(v, 2.0f, n);
    cap_shift<<<blocks, threads, 0, s>>>(v, 1.0f, n);
    cap_square<<<blocks, threads, 0, s>>>(v, n);
    CHECK(cudaStreamEndCapture(s, &captured));
    cudaGraphExec_t captured_exec;
    CHECK(cudaGraphInstantiate(&captured_exec, captured, 0));
    for (int k = 0; k < launches; ++k) CHECK(cudaGraphLaunch(captured_exec, s));

    cudaGraph_t built, child;
    CHECK(cudaGraphCreate(&built, 0));
    CHECK(cudaGraphCreate(&child, 0));
    float fill_value = 3.0f, a = 0.25f, offset = 0.5f;
    int count = n;
    void* fill_args[] = {&x, &fill_value, &count};
    void* axpy_args[] = {&x, &y, &a, &count};
    void* offset_args[] = {&y, &offset, &count};
    void* halve_args[] = {&y, &count};
    void* count_args[] = {&z, &y, &count};
    cudaMemsetParams m = {};
    m.dst = z;
    m.value = 7;
    m.elementSize = sizeof(int);
    m.width = n;
    m.height = 1;
    cudaGraphNode_t memset_node, fill_node, axpy_node, child_node, offset_node, halve_node, count_node, host_node;
    CHECK(cudaGraphAddMemsetNode(&memset_node, built, nullptr, 0, &m));
    cudaKernelNodeParams p = {};
    p.gridDim = dim3(blocks);
    p.blockDim = dim3(threads);
    p.func = reinterpret_cast<void*>(exp_fill);
    p.kernelParams = fill_args;
    CHECK(cudaGraphAddKernelNode(&fill_node, built, nullptr, 0, &p));
    p.func = reinterpret_cast<void*>(exp_axpy);
    p.kernelParams = axpy_args;
    CHECK(cudaGraphAddKernelNode(&axpy_node, built, &fill_node, 1, &p));
    p.func = reinterpret_cast<void*>(child_offset);
    p.kernelParams = offset_args;
    CHECK(cudaGraphAddKernelNode(&offset_node, child, nullptr, 0, &p));
    CHECK(cudaGraphAddChildGraphNode(&child_node, built, &axpy_node, 1, child));

    // A kernel node holding a CUkernel (func NULL, kern set), added through the driver.
    cudaKernel_t halve_kernel;
    CHECK(cudaGetKernel(&halve_kernel, exp_halve));
    AddKernelNode add_kernel_node = nullptr;
    cudaDriverEntryPointQueryResult found;
    CHECK(cudaGetDriverEntryPointByVersion("cuGraphAddKernelNode", reinterpret_cast<void**>(&add_kernel_node), 12000,
                                           cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !add_kernel_node) return report("graphs", false, "no cuGraphAddKernelNode");
    CUDA_KERNEL_NODE_PARAMS kp = {};
    kp.gridDimX = blocks, kp.gridDimY = 1, kp.gridDimZ = 1;
    kp.blockDimX = threads, kp.blockDimY = 1, kp.blockDimZ = 1;
    kp.kernelParams = halve_args;
    kp.kern = reinterpret_cast<CUkernel>(halve_kernel);
    CUgraphNode after_child = child_node;
    if (add_kernel_node(&halve_node, built, &after_child, 1, &kp) != CUDA_SUCCESS)
        return report("graphs", false, "cuGraphAddKernelNode failed");

    p.func = reinterpret_cast<void*>(exp_count);
    p.kernelParams = count_args;
    cudaGraphNode_t count_deps[] = {memset_node, halve_node};
    CHECK(cudaGraphAddKernelNode(&count_node, built, count_deps, 2, &p));
    int host_calls = 0;
    cudaHostNodeParams hp = {};
    hp.fn = count_call;
    hp.userData = &host_calls;
    CHECK(cudaGraphAddHostNode(&host_node, built, &count_node, 1, &hp));

    cudaGraphExec_t built_exec;
    CHECK(cudaGraphInstantiate(&built_exec, built, 0));
    for (int k = 0; k < launches; ++k) CHECK(cudaGraphLaunch(built_exec, s));
    CHECK(cudaStreamSynchronize(s));

    direct_sum<<<blocks, threads, 0, s>>>(v, y, out, n);  // direct
    std::vector<float> got = to_host(out, n);
    bool ok = host_calls == launches;
    double checksum = 0;
    for (int i = 0; i < n; ++i) {
        float vi = h[i] * 0.5f;
        float yi = 1.0f;
        for (int k = 0; k < launches; ++k) {
            vi = vi * 2.0f + 1.0f;
            vi = vi * vi;
            yi = ((yi + 0.25f * (3.0f + i)) + 0.5f) * 0.5f + 7.0f;
        }
        ok &= got[i] == vi + yi;
        checksum += got[i];
    }
    std::printf("graphs: host node calls %d, checksum %.9e\n", host_calls, checksum);
    return report("graphs", ok, "the graphs' results differ from the host's");
}
