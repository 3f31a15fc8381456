// Warnings about features a recording cannot reproduce faithfully (texture/
// surface objects: see uncaptured.hpp; graph launches). Each
// recorded launch lists the ones in use, and stderr says so, instead of
// recording something that would replay differently without a word.
#pragma once
#include <string>
#include <vector>

namespace mneme::rec {

// A graph launch: its kernels bypass cuLaunchKernel and are not recorded.
void note_graph_launch();
std::vector<std::string> active_usage_warnings();
long graph_launches();

}  // namespace mneme::rec
