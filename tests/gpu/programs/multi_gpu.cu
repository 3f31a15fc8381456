// One process, every visible GPU: the same kernel on each device with its own
// buffers. Each device's launch is recorded with that device's window.
#include <cstdio>
#include <vector>

__global__ void fill(int* v, int n, int value) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = value + i;
}

int main() {
  int count = 0;
  cudaGetDeviceCount(&count);
  const int n = 1024;
  std::vector<int*> bufs(count);
  for (int d = 0; d < count; ++d) {
    cudaSetDevice(d);
    cudaMalloc(&bufs[d], n * sizeof(int));
    fill<<<n / 256, 256>>>(bufs[d], n, 1000 * (d + 1));
  }
  int ok = 1;
  for (int d = 0; d < count; ++d) {
    cudaSetDevice(d);
    int last = 0;
    cudaMemcpy(&last, bufs[d] + n - 1, sizeof last, cudaMemcpyDeviceToHost);
    ok &= last == 1000 * (d + 1) + n - 1;
    std::printf("multi_gpu: device %d buffer %p last=%d\n", d, (void*)bufs[d], last);
  }
  return ok ? 0 : 1;
}
