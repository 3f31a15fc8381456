// Records one launch, then dies by the signal named in argv[1] (SEGV, KILL,
// TERM) before exiting normally: the recording of the first launch must
// survive as a valid database, and the exit status must pass through.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <unistd.h>

__global__ void square(int* v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = i * i;
}

int main(int argc, char** argv) {
  const int n = 256;
  int* v;
  cudaMalloc(&v, n * sizeof(int));
  cudaMemset(v, 0, n * sizeof(int));
  square<<<1, n>>>(v, n);
  cudaDeviceSynchronize();
  std::printf("crash_after_launch: launched\n");
  std::fflush(stdout);
  const char* how = argc > 1 ? argv[1] : "SEGV";
  if (!std::strcmp(how, "KILL")) kill(getpid(), SIGKILL);
  if (!std::strcmp(how, "TERM")) kill(getpid(), SIGTERM);
  volatile int* p = nullptr;
  *p = 1;  // SIGSEGV
  return 0;
}
