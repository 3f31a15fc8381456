#include "mneme/common/cupti_loader.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

namespace mneme::common {

void* open_cupti(std::string* path) {
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("MNEME_CUPTI_PATH")) candidates.push_back(p);
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    if (const char* root = std::getenv(var)) {
      candidates.push_back(std::string(root) + "/lib64/libcupti.so");
      candidates.push_back(std::string(root) + "/extras/CUPTI/lib64/libcupti.so");
    }
  }
  candidates.push_back("/usr/local/cuda/lib64/libcupti.so");
  candidates.push_back("/usr/local/cuda/extras/CUPTI/lib64/libcupti.so");
  candidates.push_back("libcupti.so.13");
  candidates.push_back("libcupti.so.12");
  candidates.push_back("libcupti.so");
  for (const auto& c : candidates) {
    if (void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
      if (path) *path = c;
      return h;
    }
  }
  return nullptr;
}

}  // namespace mneme::common
