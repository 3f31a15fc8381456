#include "uncaptured.hpp"

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

namespace mneme::rec {
namespace {
std::mutex g_mu;
std::map<uint64_t, ForeignRange> g_ranges;  // base -> range
std::set<uint64_t> g_objects[2];            // by ObjectKind
// Bounds of every range ever noted (never shrunk): most addresses are outside.
std::atomic<uint64_t> g_lo{~0ull}, g_hi{0};
}  // namespace

void note_foreign_range(const char* kind, uint64_t base, uint64_t size) {
  if (!base) return;
  std::lock_guard<std::mutex> lock(g_mu);
  g_ranges[base] = ForeignRange{kind, base, size};
  if (base < g_lo.load()) g_lo.store(base);
  if (base + (size ? size : 1) > g_hi.load()) g_hi.store(base + (size ? size : 1));
}

void forget_foreign_range(uint64_t base) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_ranges.erase(base);
}

bool find_foreign(uint64_t addr, ForeignRange* out) {
  // The snapshot scan asks for every word it reads: answer most without the lock.
  if (addr < g_lo.load(std::memory_order_relaxed) || addr >= g_hi.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_ranges.upper_bound(addr);
  if (it == g_ranges.begin()) return false;
  --it;
  if (addr >= it->second.base + (it->second.size ? it->second.size : 1)) return false;
  if (out) *out = it->second;
  return true;
}

std::vector<ForeignRange> foreign_ranges() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<ForeignRange> out;
  for (const auto& kv : g_ranges) out.push_back(kv.second);
  return out;
}

void note_object(ObjectKind kind, uint64_t handle, bool alive) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& set = g_objects[static_cast<int>(kind)];
  if (alive) set.insert(handle);
  else set.erase(handle);
}

std::vector<uint64_t> live_objects(ObjectKind kind) {
  std::lock_guard<std::mutex> lock(g_mu);
  const auto& set = g_objects[static_cast<int>(kind)];
  return std::vector<uint64_t>(set.begin(), set.end());
}

std::string uncaptured_json() {
  std::ostringstream os;
  os << "\"foreign_memory\": [";
  bool first = true;
  for (const auto& r : foreign_ranges()) {
    os << (first ? "" : ", ") << "{\"kind\": \"" << r.kind << "\", \"base\": " << r.base << ", \"size\": " << r.size
       << "}";
    first = false;
  }
  const char* names[2] = {"texture_objects", "surface_objects"};
  for (int k = 0; k < 2; ++k) {
    os << "], \"" << names[k] << "\": [";
    auto handles = live_objects(static_cast<ObjectKind>(k));
    for (size_t i = 0; i < handles.size(); ++i) os << (i ? ", " : "") << handles[i];
  }
  os << "]";
  return os.str();
}

}  // namespace mneme::rec
