// Several streams ordered by events: a producer on one stream, two consumers on
// others that wait for its event, and a combine step that waits for both.
#include "corpus.h"

__global__ void produce(float* v, int n, float base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = base + 0.25f * i;
}
__global__ void consume_square(const float* v, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = v[i] * v[i];
}
__global__ void consume_negate(const float* v, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = -v[i];
}
__global__ void combine(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

int main() {
    const int n = 1 << 14, threads = 256, blocks = n / threads;
    float *v, *sq, *neg, *out;
    CHECK(cudaMalloc(&v, n * sizeof(float)));
    CHECK(cudaMalloc(&sq, n * sizeof(float)));
    CHECK(cudaMalloc(&neg, n * sizeof(float)));
    CHECK(cudaMalloc(&out, n * sizeof(float)));
    cudaStream_t s[3];
    cudaEvent_t produced, squared, negated;
    for (auto& st : s) CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CHECK(cudaEventCreateWithFlags(&produced, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&squared, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&negated, cudaEventDisableTiming));

    produce<<<blocks, threads, 0, s[0]>>>(v, n, 1.0f);
    CHECK(cudaEventRecord(produced, s[0]));
    CHECK(cudaStreamWaitEvent(s[1], produced, 0));
    CHECK(cudaStreamWaitEvent(s[2], produced, 0));
    consume_square<<<blocks, threads, 0, s[1]>>>(v, sq, n);
    consume_negate<<<blocks, threads, 0, s[2]>>>(v, neg, n);
    CHECK(cudaEventRecord(squared, s[1]));
    CHECK(cudaEventRecord(negated, s[2]));
    CHECK(cudaStreamWaitEvent(s[0], squared, 0));
    CHECK(cudaStreamWaitEvent(s[0], negated, 0));
    combine<<<blocks, threads, 0, s[0]>>>(sq, neg, out, n);
    CHECK(cudaStreamSynchronize(s[0]));

    std::vector<float> got = to_host(out, n);
    bool ok = true;
    for (int i = 0; i < n; ++i) {
        float vi = 1.0f + 0.25f * i;
        ok &= got[i] == vi * vi + -vi;
    }
    return report("streams_events", ok, "out != v*v - v");
}
