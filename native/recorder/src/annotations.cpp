#include "annotations.hpp"

#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "mneme/common/text.hpp"

#include "memory_window.hpp"
#include "spool.hpp"

using namespace mneme::common;

namespace mneme::rec {
namespace {
std::mutex g_mu;
std::map<uint64_t, std::string> g_policies;

bool one_of(const char* v, std::initializer_list<const char*> allowed) {
  if (!v) return false;
  for (const char* a : allowed)
    if (std::strcmp(v, a) == 0) return true;
  return false;
}
}  // namespace

std::string policy_json(uint64_t base) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_policies.find(base);
  return it == g_policies.end() ? "" : it->second;
}

}  // namespace mneme::rec

extern "C" __attribute__((visibility("default"))) int mneme_annotate_v1(const void* ptr, const char* dtype,
                                                                       const char* mode, double threshold,
                                                                       const char* norm) {
  using namespace mneme::rec;
  if (!dtype || !*dtype || !one_of(mode, {"bitwise", "absolute", "relative"}) || !one_of(norm, {"none", "l1", "l2", "linf", "max"}) ||
      threshold < 0)
    return 2;
  Allocation a;
  if (!MemoryWindow::instance().find(reinterpret_cast<uint64_t>(ptr), &a)) return 1;
  char number[64];
  std::snprintf(number, sizeof number, "%.17g", threshold);
  std::string body = "{\"dtype\": " + json_string(dtype) + ", \"mode\": " + json_string(mode) +
                     ", \"threshold\": " + number + ", \"norm\": " + json_string(norm) + "}";
  std::lock_guard<std::mutex> lock(g_mu);
  g_policies[a.base] = body;
  return 0;
}
