#include "code_images.hpp"

#include <mutex>
#include <string>
#include <unordered_map>

#include "mneme/common/driver_api.hpp"
#include "mneme/common/elf_symbols.hpp"

using namespace mneme::common;

namespace mneme::rec {
namespace {

// Module images up to this size are copied (Triton's cubins are kBs).
constexpr size_t kCopyLimit = 64ull << 20;

std::mutex g_mu;
std::unordered_map<CUlibrary, const void*> g_libraries;
std::unordered_map<CUmodule, std::string> g_modules;

}  // namespace

void remember_library_image(CUlibrary library, const void* image) {
  if (!library || !image) return;
  std::lock_guard<std::mutex> lock(g_mu);
  g_libraries[library] = image;
}

void remember_module_image(CUmodule module, const void* image) {
  if (!module || !image) return;
  const char* kind = "";
  const void* data = nullptr;
  size_t size = image_size(image, &kind, &data);
  if (!size || size > kCopyLimit) return;
  std::string copy(static_cast<const char*>(data), size);
  if (std::string(kind) == "ptx") copy.push_back('\0');  // image_size reads PTX as NUL-terminated text
  std::lock_guard<std::mutex> lock(g_mu);
  g_modules[module] = std::move(copy);
}

const void* image_of_function(CUfunction f) {
  if (!f) return nullptr;
  auto& d = driver();
  CUlibrary lib = nullptr;
  if (d.cuKernelGetLibrary && d.cuKernelGetLibrary(&lib, reinterpret_cast<CUkernel>(f)) == CUDA_SUCCESS && lib) {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_libraries.find(lib);
    if (it != g_libraries.end()) return it->second;
  }
  CUmodule mod = nullptr;
  if (d.cuFuncGetModule && d.cuFuncGetModule(&mod, f) == CUDA_SUCCESS && mod) {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_modules.find(mod);
    if (it != g_modules.end()) return it->second.data();
  }
  return nullptr;
}

void load_function(CUfunction f) {
  auto& d = driver();
  if (!f || !d.cuFuncLoad) return;
  // A CUfunction has a module; a CUkernel (cudart's handles) has a function in
  // the current context, which loads its module there.
  CUmodule mod = nullptr;
  if (d.cuFuncGetModule && d.cuFuncGetModule(&mod, f) == CUDA_SUCCESS && mod) {
    d.cuFuncLoad(f);
    return;
  }
  CUfunction in_context = nullptr;
  if (d.cuKernelGetFunction && d.cuKernelGetFunction(&in_context, reinterpret_cast<CUkernel>(f)) == CUDA_SUCCESS &&
      in_context)
    d.cuFuncLoad(in_context);
}

}  // namespace mneme::rec
