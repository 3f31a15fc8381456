// Observes module loads and kernel launches through CUPTI callbacks and, for
// each launch the selection admits, writes a spool entry: prologue snapshot,
// launch, epilogue snapshot, launch metadata (record_agent/README.md).
#pragma once
#include <cupti.h>

#include <string>
#include <vector>

namespace mneme::rec {

// One kernel launch as the recorder reads it: from a launch callback's
// parameters, or from a kernel node of a CUDA graph (graph_expansion.cpp).
struct Launch {
  CUfunction f = nullptr;
  const char* api = "";
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned shared_mem = 0;
  CUstream stream = nullptr;
  void** kernel_params = nullptr;
  void** extra = nullptr;
  std::vector<std::string> attributes;  // JSON objects of launch attributes
};

void CUPTIAPI on_callback(void* userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* cbdata);
// How the recorder switches the CUPTI launch callbacks on and off: on from the
// start under lazy module loading; under eager loading off until a loaded
// module defines a selected kernel.
void set_launch_callback_switch(void (*enable)(bool));
void write_recorder_info(const char* cupti_path);
void write_done_marker();

// A launch attribute as launch.json lists it; empty for one the driver ignores.
std::string attribute_json(const CUlaunchAttribute& at);

// Whether a launch like `l` could be recorded if it ran now (asked for a
// graph's kernel nodes before the graph runs): `never` when the filter
// rejects its kernel, its instances are used up, its device is not selected
// or recording stopped; `seen` when an identical launch was recorded and
// duplicates are not; else `maybe` (also when its arguments cannot be read:
// `kernel_params` and `extra` null).
enum class Prospect { never, seen, maybe };
Prospect recording_prospect(const Launch& l);

// The kernel's name as the recorder knows it (mangled; "" when unknown).
std::string kernel_name(CUfunction f);

// The recorder's cuGraphLaunch (graph_expansion.cpp) around a graph launch:
// it counts as a launch at the recording gate (deadlines.hpp), so it waits
// while another thread's launch is being recorded (at most until its deadline).
void enter_graph_launch();
void leave_graph_launch();

}  // namespace mneme::rec
