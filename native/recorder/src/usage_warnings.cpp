#include "usage_warnings.hpp"

#include <atomic>
#include <cstdio>

#include "uncaptured.hpp"

namespace mneme::rec {
namespace {
std::atomic<long> g_graphs{0};
}

void note_graph_launch() {
  if (g_graphs++ == 0)
    std::fprintf(stderr, "mneme record: warning: the application launches CUDA graphs; kernels inside graphs are not"
                         " recorded (record a run without graphs to capture them)\n");
}

long graph_launches() { return g_graphs.load(); }

std::vector<std::string> active_usage_warnings() {
  std::vector<std::string> out;
  if (!live_objects(ObjectKind::texture).empty()) out.push_back("texture objects exist; texture state is not captured");
  if (!live_objects(ObjectKind::surface).empty()) out.push_back("surface objects exist; surface state is not captured");
  return out;
}

}  // namespace mneme::rec
