#include "usage_warnings.hpp"

#include "uncaptured.hpp"

namespace mneme::rec {

std::vector<std::string> active_usage_warnings() {
  std::vector<std::string> out;
  if (!live_objects(ObjectKind::texture).empty()) out.push_back("texture objects exist; texture state is not captured");
  if (!live_objects(ObjectKind::surface).empty()) out.push_back("surface objects exist; surface state is not captured");
  return out;
}

}  // namespace mneme::rec
