#include "mneme/common/settings.hpp"

#include <algorithm>
#include <cstdlib>
#include <sstream>

namespace mneme::common {
namespace {

std::string env(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

Settings load() {
  Settings s;
  s.spool_dir = env("MNEME_SPOOL_DIR");
  s.active = !s.spool_dir.empty();
  if (auto v = env("MNEME_VA_BASE"); !v.empty()) s.va_base = std::strtoull(v.c_str(), nullptr, 0);
  if (auto v = env("MNEME_VA_SIZE"); !v.empty()) s.va_size = std::strtoull(v.c_str(), nullptr, 0);
  s.kernel_regexes = split(env("MNEME_KERNEL_REGEX"), '\n');
  if (auto v = env("MNEME_SKIP"); !v.empty()) s.skip = std::strtol(v.c_str(), nullptr, 0);
  if (auto v = env("MNEME_MAX"); !v.empty()) s.max_instances = std::strtol(v.c_str(), nullptr, 0);
  for (const auto& item : split(env("MNEME_INSTANCES"), ',')) {
    InstanceSlice slice;
    size_t a = item.find(':'), b = item.find(':', a + 1);
    std::string p0 = item.substr(0, a);
    std::string p1 = a == std::string::npos ? "" : item.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
    std::string p2 = b == std::string::npos ? "" : item.substr(b + 1);
    if (!p0.empty()) slice.start = std::strtol(p0.c_str(), nullptr, 0);
    if (!p1.empty()) slice.stop = std::strtol(p1.c_str(), nullptr, 0);
    if (!p2.empty()) slice.step = std::max(1L, std::strtol(p2.c_str(), nullptr, 0));
    if (a == std::string::npos) slice.stop = slice.start + 1;  // a single launch index
    s.instances.push_back(slice);
  }
  s.snapshot_scope = env("MNEME_SNAPSHOT_SCOPE", "auto");
  s.eager_loading = env("CUDA_MODULE_LOADING") == "EAGER";
  if (auto v = env("MNEME_MAX_SNAPSHOT_BYTES"); !v.empty()) s.max_snapshot_bytes = std::strtoull(v.c_str(), nullptr, 0);
  if (auto v = env("MNEME_SPOOL_MAX_BYTES"); !v.empty()) s.spool_max_bytes = std::strtoull(v.c_str(), nullptr, 0);
  if (auto v = env("MNEME_SPOOL_WRITERS"); !v.empty()) s.spool_writers = std::atoi(v.c_str());
  for (const auto& d : split(env("MNEME_DEVICES"), ',')) s.devices.push_back(std::atoi(d.c_str()));
  s.record_duplicates = env("MNEME_RECORD_DUPLICATES") == "1";
  s.gpu_digests = env("MNEME_DIGESTS") != "0";
  s.rank = env("MNEME_RANK");
  s.verbose = env("MNEME_VERBOSE") == "1";
  return s;
}

}  // namespace

const Settings& settings() {
  static const Settings s = load();
  return s;
}

}  // namespace mneme::common
