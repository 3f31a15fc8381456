// The --kernel filter: ECMAScript regexes searched in a kernel's mangled or
// demangled name. Loaded modules are checked kernel by kernel (PyTorch's and
// cuBLAS's hold thousands), and demangling a long template name costs ~10 us:
// a regex that is a plain identifier is decided on the mangled name wherever
// that is exact, so most names are never demangled.
#pragma once
#include <regex>
#include <string>
#include <vector>

namespace mneme::rec {

class NameFilter {
 public:
  explicit NameFilter(const std::vector<std::string>& regexes);  // invalid ones are ignored, with a warning
  bool matches(const std::string& mangled) const;  // true for every name when no regex was given

 private:
  struct Pattern {
    std::regex re;
    std::string literal;  // the identifier a plain pattern (`name`, `^name`, `name$`, `^name$`) looks for
    bool start = false, end = false;
  };
  std::vector<Pattern> patterns_;
  bool all_ = true;
};

}  // namespace mneme::rec
