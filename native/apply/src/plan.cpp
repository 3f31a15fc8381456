#include "plan.hpp"

#include <fstream>
#include <sstream>

namespace mneme::apply {

uint64_t fnv1a64(const void* data, size_t size) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

namespace {

bool read_shape(std::istringstream& in, Shape* s) {
  for (auto& v : s->grid) in >> v;
  for (auto& v : s->block) in >> v;
  in >> s->shared_mem;
  return !in.fail();
}

std::string unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(char(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

}  // namespace

Plan read_plan(const std::string& path) {
  Plan plan;
  std::ifstream file(path);
  if (!file) {
    plan.error = "cannot read the apply plan " + path;
    return plan;
  }
  std::string line;
  if (!std::getline(file, line) || line != "mneme-apply-plan 1") {
    plan.error = path + " is not an apply plan of this version (write it with `mneme run --apply`)";
    return plan;
  }
  PlanEntry* e = nullptr;
  int n = 1;
  while (std::getline(file, line)) {
    ++n;
    std::istringstream in(line);
    std::string key;
    if (!(in >> key)) continue;
    bool ok = true;
    if (key == "verify") in >> plan.verify;
    else if (key == "force") in >> plan.force;
    else if (key == "device") in >> plan.cc_major >> plan.cc_minor >> plan.driver_version;
    else if (key == "kernel") {
      plan.entries.emplace_back();
      e = &plan.entries.back();
      in >> e->name;
    } else if (!e) ok = false;
    else if (key == "static") in >> e->static_hash;
    else if (key == "cubin_fnv") {
      std::string hex;
      in >> hex;
      e->cubin_fnv = std::stoull(hex, nullptr, 16);
    } else if (key == "recorded") ok = read_shape(in, &e->recorded);
    else if (key == "tuned") ok = read_shape(in, &e->tuned);
    else if (key == "code") {
      std::getline(in >> std::ws, e->code_path);
      if (e->code_path == "-") e->code_path.clear();
    } else if (key == "similar") in >> e->similar;
    else if (key == "pointers") {
      std::string item;
      while (in >> item) {
        size_t colon = item.find(':');
        if (colon == std::string::npos) {
          ok = false;
          break;
        }
        e->pointers.emplace_back(std::stoi(item.substr(0, colon)), std::stoi(item.substr(colon + 1)));
      }
      in.clear();
    } else if (key == "fixed") {
      int i;
      std::string hex;
      in >> i >> hex;
      e->fixed.emplace_back(i, unhex(hex));
    } else ok = false;
    if (!ok || in.fail()) {
      plan.error = path + ":" + std::to_string(n) + ": cannot read '" + line + "'";
      return plan;
    }
  }
  plan.loaded = true;
  return plan;
}

}  // namespace mneme::apply
