// Kernel nodes of CUDA graphs, recorded one by one (docs/recording.md#cuda-graphs).
//
// When an instantiated graph is created the recorder copies the graph it came
// from (cuGraphClone: the application may change or destroy its graph
// afterwards). When the application launches it through the recorder's
// cuGraphLaunch and a kernel node in it may still be recorded, the recorder
// runs the graph's nodes instead, one by one in a topological order on the
// launch's stream (a legal schedule of the graph): kernel nodes through the
// driver's cuLaunchKernel(Ex), so the launch callbacks record them as direct
// launches, with the memory state at the moment each runs. A graph with a node
// the recorder cannot run on its own (memory allocation/free, conditional,
// external semaphore, batch memory operation nodes), or an instance changed
// after instantiation, is launched whole and each of its kernel nodes that
// would have been recorded is named on stderr. A graph with nothing left to
// record goes to the driver's cuGraphLaunch at once.
#pragma once
#include <cupti.h>

#include <vector>

namespace mneme::rec {

using GraphLaunchFn = CUresult (*)(CUgraphExec, CUstream);

// The recorder's cuGraphLaunch (interpose.cpp hands it out): runs `exec` node
// by node when that records something, else calls `real`, the driver's entry
// point (its per-thread-default-stream variant when `per_thread_stream`).
CUresult launch_graph(CUgraphExec exec, CUstream stream, GraphLaunchFn real, bool per_thread_stream);

// The driver API callbacks this needs (injection.cpp enables them):
// instantiation, changes to instances, their destruction, graph launches.
const std::vector<CUpti_CallbackId>& graph_callback_ids();
// Handles a callback of one of those ids (false for any other id).
bool on_graph_callback(CUpti_CallbackId cbid, const CUpti_CallbackData* cb);

long graph_launches();           // every graph launch seen
long graph_launches_expanded();  // those run node by node

}  // namespace mneme::rec
