// Text the recorder and the apply library write: JSON string literals (the
// spool's metadata and the apply report are flat JSON written by hand) and
// kernel names for people.
#pragma once
#include <string>

namespace mneme::common {

// `s` as a JSON string literal, quotes included (control bytes as \u00XX,
// other bytes as they are).
std::string json_string(const std::string& s);

// The demangled form of a kernel's mangled name; the name itself when it
// does not demangle.
std::string demangle(const std::string& name);

}  // namespace mneme::common
