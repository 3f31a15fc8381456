#include "mneme/common/elf_symbols.hpp"

#include <elf.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace mneme::common {

CubinSymbols read_cubin_symbols(const void* image, size_t size) {
  CubinSymbols out;
  auto* base = static_cast<const unsigned char*>(image);
  if (!image || size < sizeof(Elf64_Ehdr) || std::memcmp(base, ELFMAG, SELFMAG) != 0 || base[EI_CLASS] != ELFCLASS64)
    return out;
  auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
  if (eh->e_shoff == 0 || eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_shoff + eh->e_shnum * sizeof(Elf64_Shdr) > size)
    return out;
  auto* sh = reinterpret_cast<const Elf64_Shdr*>(base + eh->e_shoff);
  auto in_bounds = [&](const Elf64_Shdr& s) { return s.sh_offset + s.sh_size <= size; };
  if (eh->e_shstrndx >= eh->e_shnum || !in_bounds(sh[eh->e_shstrndx])) return out;
  const char* shstr = reinterpret_cast<const char*>(base + sh[eh->e_shstrndx].sh_offset);
  auto section_name = [&](unsigned idx) -> const char* {
    if (idx == 0 || idx >= eh->e_shnum) return "";
    return shstr + sh[idx].sh_name;
  };
  for (unsigned i = 0; i < eh->e_shnum; ++i) {
    if (sh[i].sh_type != SHT_SYMTAB || !in_bounds(sh[i]) || sh[i].sh_link >= eh->e_shnum) continue;
    const Elf64_Shdr& strs = sh[sh[i].sh_link];
    if (!in_bounds(strs)) continue;
    out.readable = true;
    const char* strtab = reinterpret_cast<const char*>(base + strs.sh_offset);
    auto* syms = reinterpret_cast<const Elf64_Sym*>(base + sh[i].sh_offset);
    size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
    for (size_t k = 0; k < n; ++k) {
      const Elf64_Sym& s = syms[k];
      if (s.st_name >= strs.sh_size || s.st_shndx == SHN_UNDEF || s.st_shndx >= eh->e_shnum) continue;
      const char* name = strtab + s.st_name;
      const char* sec = section_name(s.st_shndx);
      int type = ELF64_ST_TYPE(s.st_info);
      if (type == STT_FUNC && std::strncmp(sec, ".text.", 6) == 0 && std::strcmp(sec + 6, name) == 0) {
        out.kernels.emplace_back(name);
      } else if (type == STT_OBJECT && *name &&
                 (std::strncmp(sec, ".nv.global", 10) == 0 ||
                  (std::strncmp(sec, ".nv.constant", 12) == 0 && std::strncmp(sec, ".nv.constant0", 13) != 0))) {
        out.globals.emplace_back(name);
      }
    }
  }
  std::sort(out.globals.begin(), out.globals.end());
  out.globals.erase(std::unique(out.globals.begin(), out.globals.end()), out.globals.end());
  return out;
}

namespace {
constexpr uint32_t kFatbinMagic = 0xBA55ED50u;
constexpr uint32_t kFatbinWrapperMagic = 0x466243B1u;

size_t fatbin_size(const unsigned char* p) {
  uint16_t header_size;
  uint64_t fat_size;
  std::memcpy(&header_size, p + 6, 2);
  std::memcpy(&fat_size, p + 8, 8);
  return header_size + fat_size;
}
}  // namespace

size_t image_size(const void* image, const char** kind, const void** data) {
  *kind = "";
  *data = image;
  if (!image) return 0;
  auto* p = static_cast<const unsigned char*>(image);
  uint32_t magic;
  std::memcpy(&magic, p, 4);
  if (magic == kFatbinWrapperMagic) {
    const unsigned char* fb;
    std::memcpy(&fb, p + 8, sizeof(fb));
    if (!fb) return 0;
    std::memcpy(&magic, fb, 4);
    if (magic != kFatbinMagic) return 0;
    *kind = "fatbin";
    *data = fb;
    return fatbin_size(fb);
  }
  if (magic == kFatbinMagic) {
    *kind = "fatbin";
    return fatbin_size(p);
  }
  if (std::memcmp(p, ELFMAG, SELFMAG) == 0 && p[EI_CLASS] == ELFCLASS64) {
    auto* eh = reinterpret_cast<const Elf64_Ehdr*>(p);
    size_t end = eh->e_shoff + size_t(eh->e_shnum) * eh->e_shentsize;
    end = std::max(end, size_t(eh->e_phoff + size_t(eh->e_phnum) * eh->e_phentsize));
    *kind = "elf";
    return end;
  }
  // PTX is NUL-terminated text.
  size_t n = std::strlen(reinterpret_cast<const char*>(p));
  if (n > 0 && memmem(p, std::min<size_t>(n, 4096), ".version", 8)) {
    *kind = "ptx";
    return n;
  }
  return 0;
}

}  // namespace mneme::common
