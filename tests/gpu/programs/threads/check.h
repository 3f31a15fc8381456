// CHECK(call): a CUDA runtime error ends the program with status 3 and the place it happened.
#pragma once
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CHECK(x)                                                                          \
  do {                                                                                    \
    cudaError_t e = (x);                                                                  \
    if (e != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e));     \
      std::exit(3);                                                                       \
    }                                                                                     \
  } while (0)
