// A CUDA graph the recorder cannot run node by node: cudaMallocAsync and
// cudaFreeAsync inside a stream capture make memory allocation and free nodes.
// The graph is launched (twice) whole; its kernel nodes (pool_fill,
// pool_drain) are not recorded and stderr names each once. The direct launch
// after it (plain_twice) is recorded. tests/gpu/test_graphs.py.
#include <cstdio>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)

__global__ void pool_fill(float* t, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) t[i] = i * 0.5f;
}
__global__ void pool_drain(const float* t, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = t[i] + 1.0f;
}
__global__ void plain_twice(float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] *= 2.0f;
}

int main() {
  const int n = 4096, threads = 256, blocks = n / threads;
  float* out = nullptr;
  CHECK(cudaMalloc(&out, n * sizeof(float)));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  float* t = nullptr;
  CHECK(cudaMallocAsync(&t, n * sizeof(float), s));
  pool_fill<<<blocks, threads, 0, s>>>(t, n);
  pool_drain<<<blocks, threads, 0, s>>>(t, out, n);
  CHECK(cudaFreeAsync(t, s));
  CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int k = 0; k < 2; ++k) CHECK(cudaGraphLaunch(exec, s));
  CHECK(cudaStreamSynchronize(s));
  plain_twice<<<blocks, threads, 0, s>>>(out, n);
  std::vector<float> got(n);
  CHECK(cudaMemcpy(got.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
  bool ok = true;
  for (int i = 0; i < n; ++i) ok &= got[i] == (i * 0.5f + 1.0f) * 2.0f;
  std::printf("graph_mem_node: %s\n", ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
