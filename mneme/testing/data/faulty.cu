// A vector add that misbehaves on purpose for some launch shapes, so that the
// replay server's GPU tests can mix good configurations with ones that trap,
// hit an illegal address or spin forever (tests/gpu/test_server.py).
// Built with: nvcc -arch=sm_90 -cubin faulty.cu; nvcc -arch=sm_90 -ptx faulty.cu
extern "C" __global__ void faulty_add(const float* a, const float* b, float* c, const int* spin, int n) {
  if (blockDim.x == 96) {
    __trap();                               // a trap: the context is lost
  }
  if (blockDim.x == 160) {
    *(volatile int*)(0x10) = threadIdx.x;   // an illegal address
  }
  if (blockDim.x == 224) {
    while (*(volatile const int*)spin == 0) {  // *spin is 0 and nothing changes it: spins forever
    }
  }
  // Grid-stride, so every other block size computes the whole result and verifies.
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    c[i] = a[i] + b[i];
  }
}
