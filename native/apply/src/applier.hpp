// The apply library's core: which launches get the tuned code and shape, the
// --apply-verify comparison, and the report at exit. docs/apply.md describes
// the rules; mneme/apply/plan.py decides what the plan holds.
#pragma once
#include <cuda.h>

#include <cstddef>

namespace mneme::apply {

// One launch as the application made it, through any of the wrapped entry points.
struct LaunchCall {
  bool per_thread_stream = false;   // the _ptsz variant
  const CUlaunchConfig* ex = nullptr;  // cuLaunchKernelEx: the application's configuration
  CUfunction f = nullptr;
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned shared_mem = 0;
  CUstream stream = nullptr;
  void** params = nullptr;
  void** extra = nullptr;
};

// Whether a plan was given and read (otherwise every call only forwards).
bool active();

// CUPTI's module-loaded callback: the image the driver loaded.
void on_module_loaded(const void* cubin, size_t size);

// Runs the launch: the tuned one where the plan says so and every check
// passes, the application's own otherwise.
CUresult launch(const LaunchCall& call);

}  // namespace mneme::apply
