// Warnings about features a recording cannot reproduce faithfully (texture/
// surface objects: see uncaptured.hpp). Each recorded launch lists the ones in
// use, and stderr says so, instead of recording something that would replay
// differently without a word. (Kernel nodes of CUDA graphs that cannot be
// recorded are warned about per node: graph_expansion.hpp.)
#pragma once
#include <string>
#include <vector>

namespace mneme::rec {

std::vector<std::string> active_usage_warnings();

}  // namespace mneme::rec
