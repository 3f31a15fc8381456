// Uses what recordings once could not reproduce: managed memory, and a kernel
// captured into a CUDA graph (recorded when the graph is launched, node by
// node). Both instances must be recorded, replayable, with no warning.
#include <cstdio>

__global__ void bump(int* v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] += 1;
}

int main() {
  const int n = 256;
  int* managed;  // small: never ask for much managed memory
  cudaMallocManaged(&managed, n * sizeof(int));
  int* plain;
  cudaMalloc(&plain, n * sizeof(int));
  cudaMemset(plain, 0, n * sizeof(int));
  bump<<<1, n>>>(plain, n);  // recorded (managed memory is captured: no warning)

  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  bump<<<1, n, 0, s>>>(managed, n);  // captured: recorded at the graph's launch
  cudaStreamEndCapture(s, &graph);
  cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphLaunch(exec, s);  // runs node by node under the recorder
  cudaStreamSynchronize(s);
  std::printf("unsupported: managed[0]=%d\n", managed[0]);
  return managed[0] == 1 ? 0 : 1;
}
