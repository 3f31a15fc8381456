// Finding libcupti at run time (dlopen: no link-time dependency), for the
// recorder and the apply library alike.
#pragma once
#include <string>

namespace mneme::common {

// MNEME_CUPTI_PATH, then the toolkit roots (CUDA_HOME, CUDA_PATH,
// /usr/local/cuda), then the loader's search path. *path: the one opened.
void* open_cupti(std::string* path);

}  // namespace mneme::common
