#include "name_filter.hpp"

#include <cstdio>
#include <cstring>

#include "mneme/common/text.hpp"

using namespace mneme::common;

namespace mneme::rec {
namespace {

// Words a demangled name can hold that its mangled form spells otherwise
// (builtin types are one letter, std:: names are abbreviations, ...). Every
// other identifier of a demangled name is in the mangled name verbatim.
const char* const kVocabulary[] = {
    "void", "wchar_t", "bool", "char", "signed", "unsigned", "short", "int", "long", "float", "double",
    "__int128", "__float128", "char8_t", "char16_t", "char32_t", "_Float16", "__bf16", "__fp16", "_BitInt",
    "auto", "decltype", "nullptr_t", "std", "anonymous", "namespace", "lambda", "unnamed", "operator", "const",
    "volatile", "restrict", "sizeof", "alignof", "noexcept", "throw", "typeid", "true", "false", "abi",
    "string", "allocator", "basic_string", "char_traits", "istream", "ostream", "iostream", "basic_istream",
    "basic_ostream", "basic_iostream", "vtable", "typeinfo", "construction", "guard", "variable", "thunk",
    "covariant", "virtual", "transaction", "clone", "template", "typename", "parm", "struct", "union", "enum",
};

// An identifier (no digits: numbers are spelled differently in both forms)
// that no vocabulary word contains: found in a demangled name only if the
// mangled name contains it too.
bool plain_identifier(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_')) return false;
  for (const char* word : kVocabulary)
    if (std::strstr(word, s.c_str())) return false;
  return true;
}

}  // namespace

NameFilter::NameFilter(const std::vector<std::string>& regexes) : all_(regexes.empty()) {
  for (const auto& r : regexes) {
    Pattern p;
    try {
      p.re = std::regex(r, std::regex::ECMAScript);
    } catch (const std::regex_error&) {
      std::fprintf(stderr, "mneme record: warning: ignoring invalid kernel regex '%s'\n", r.c_str());
      continue;
    }
    std::string body = r;
    if (!body.empty() && body.front() == '^') p.start = true, body.erase(0, 1);
    if (!body.empty() && body.back() == '$') p.end = true, body.pop_back();
    if (plain_identifier(body)) p.literal = body;
    patterns_.push_back(std::move(p));
  }
}

bool NameFilter::matches(const std::string& mangled) const {
  if (all_) return true;
  std::string pretty;
  bool demangled = false;
  for (const auto& p : patterns_) {
    if (!p.literal.empty()) {
      const std::string& l = p.literal;
      size_t at = mangled.find(l);
      if (at == std::string::npos) continue;  // in neither form
      bool hit = p.start && p.end ? mangled == l
                 : p.start        ? at == 0
                 : p.end          ? mangled.size() >= l.size() && mangled.compare(mangled.size() - l.size(), l.size(), l) == 0
                                  : true;
      if (hit) return true;
    } else if (std::regex_search(mangled, p.re)) {
      return true;
    }
    if (!demangled) pretty = demangle(mangled), demangled = true;
    if (std::regex_search(pretty, p.re)) return true;
  }
  return false;
}

}  // namespace mneme::rec
