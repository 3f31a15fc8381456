// Kernel timing from CUPTI activity records (the alternative to CUDA events).
//
// libcupti is dlopen()ed on first use, like the driver: the engine builds and
// imports without it, and timing falls back to events where it is missing.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mneme {

// Empty when CUPTI activity timing can be used in this process, else why not.
std::string cupti_unavailable_reason();

// Start collecting kernel records (collection stays on until cupti_collect).
void cupti_begin();

// Flush and return (start, end) in ns of the kernels named `kernel` that ran on
// `stream` of `context` since the last cupti_begin, in launch order; stops collecting.
std::vector<std::pair<uint64_t, uint64_t>> cupti_collect(CUcontext context, CUstream stream, const std::string& kernel);

// The dlopen() handle of libcupti as the loader above finds it (MNEME_CUPTI_LIB, the toolkit's
// folders); nullptr when it is not found. Other CUPTI users of the engine (profiler.cpp) resolve
// their entry points from it.
void* cupti_library();

}  // namespace mneme
