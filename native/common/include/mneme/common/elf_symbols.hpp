// Reads the symbol table of a cubin (an ELF image) to learn which kernels a
// module defines and which __device__/__constant__ variables it holds, so the
// recorder can snapshot those globals (the driver has no call to list them) and
// the apply library can tell which module defines a tuned kernel.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace mneme::common {

struct CubinSymbols {
  bool readable = false;  // a well-formed ELF with a symbol table
  std::vector<std::string> kernels;
  std::vector<std::string> globals;
};

// Empty result for anything that is not a well-formed 64-bit ELF.
CubinSymbols read_cubin_symbols(const void* image, size_t size);

// Size of an image handed to a module/library load call: PTX text, fatbin,
// fatbin wrapper or ELF. 0 when unknown. `*kind` = "ptx" | "fatbin" | "elf".
size_t image_size(const void* image, const char** kind, const void** data);

}  // namespace mneme::common
