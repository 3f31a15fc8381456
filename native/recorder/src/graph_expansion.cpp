#include "graph_expansion.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "mneme/common/driver_api.hpp"
#include "mneme/common/settings.hpp"

#include "launch_recorder.hpp"

using namespace mneme::common;

namespace mneme::rec {
namespace {

struct KernelNode {
  Launch launch;                              // as the recorder's launch callback will read it
  std::vector<CUlaunchAttribute> attributes;  // the node's, to launch it with
};

struct Step {
  CUgraphNode node = nullptr;
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  int kernel = -1;  // index into Plan::kernels for a kernel node
};

// What the recorder knows of one instantiated graph (CUgraphExec).
struct Plan {
  CUgraph copy = nullptr;            // the graph as instantiated, owned by the plan
  std::vector<Step> steps;           // a topological order, child graphs inlined
  std::vector<KernelNode> kernels;
  std::string refusal;               // why the graph cannot run node by node ("the graph holds ..."); "" when it can
  bool settled = false;              // nothing in it will be recorded any more: launched whole
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (copy && driver().cuGraphDestroy) driver().cuGraphDestroy(copy);
  }
};

std::mutex g_mu;  // the plans and their `refusal`/`settled`; taken before launch_recorder's lock, never after
// Never destroyed: plans destroy graphs, which the driver may no longer do at exit.
auto& g_plans = *new std::unordered_map<CUgraphExec, std::shared_ptr<Plan>>();
std::atomic<long> g_launches{0}, g_expanded{0};
std::atomic<bool> g_unknown_warned{false}, g_bypass_warned{false}, g_driver_warned{false};
thread_local bool t_in_wrapper = false;  // the driver's cuGraphLaunch is called from launch_graph

void refuse(Plan& plan, const std::string& why) {
  if (plan.refusal.empty()) plan.refusal = why;
}

std::string node_kind(CUgraphNodeType type) {
  switch (type) {
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL:
      return "an external semaphore signal node";
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT:
      return "an external semaphore wait node";
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
      return "a memory allocation node (cudaMallocAsync in stream capture, cudaGraphAddMemAllocNode)";
    case CU_GRAPH_NODE_TYPE_MEM_FREE:
      return "a memory free node (cudaFreeAsync in stream capture, cudaGraphAddMemFreeNode)";
    case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP:
      return "a batch memory operation node (stream wait/write value)";
    case CU_GRAPH_NODE_TYPE_CONDITIONAL:
      return "a conditional node";
    default:
      return "a node of type " + std::to_string(int(type));
  }
}

// The driver functions that reading and running a graph needs.
bool driver_can_expand() {
  auto& d = driver();
  return d.cuGraphClone && d.cuGraphDestroy && d.cuGraphGetNodes && (d.cuGraphGetEdges_v2 || d.cuGraphGetEdges_v1) &&
         d.cuGraphNodeGetType && d.cuGraphKernelNodeGetParams_v2 && d.cuGraphKernelNodeGetAttribute &&
         d.cuGraphMemsetNodeGetParams && d.cuGraphMemcpyNodeGetParams && d.cuGraphHostNodeGetParams &&
         d.cuGraphChildGraphNodeGetGraph && d.cuGraphEventRecordNodeGetEvent && d.cuGraphEventWaitNodeGetEvent &&
         d.cuLaunchKernel && d.cuLaunchKernelEx && d.cuMemsetD8Async && d.cuMemsetD16Async && d.cuMemsetD32Async &&
         d.cuMemsetD2D8Async && d.cuMemsetD2D16Async && d.cuMemsetD2D32Async && d.cuMemcpy3DAsync_v2 &&
         d.cuLaunchHostFunc && d.cuStreamWaitEvent && d.cuEventRecord && d.cuStreamIsCapturing;
}

// ---- reading a graph ------------------------------------------------------

bool nodes_of(CUgraph g, std::vector<CUgraphNode>* nodes) {
  size_t n = 0;
  if (driver().cuGraphGetNodes(g, nullptr, &n) != CUDA_SUCCESS) return false;
  nodes->resize(n);
  if (n && driver().cuGraphGetNodes(g, nodes->data(), &n) != CUDA_SUCCESS) return false;
  nodes->resize(n);
  return true;
}

bool edges_of(CUgraph g, std::vector<CUgraphNode>* from, std::vector<CUgraphNode>* to) {
  auto& d = driver();
  size_t n = 0;
  CUresult r = d.cuGraphGetEdges_v2 ? d.cuGraphGetEdges_v2(g, nullptr, nullptr, nullptr, &n)
                                    : d.cuGraphGetEdges_v1(g, nullptr, nullptr, &n);
  if (r != CUDA_SUCCESS) return false;
  from->resize(n);
  to->resize(n);
  std::vector<CUgraphEdgeData> data(n);  // asked for, or programmatic edges make the query lossy
  if (n) {
    r = d.cuGraphGetEdges_v2 ? d.cuGraphGetEdges_v2(g, from->data(), to->data(), data.data(), &n)
                             : d.cuGraphGetEdges_v1(g, from->data(), to->data(), &n);
    if (r != CUDA_SUCCESS) return false;
  }
  from->resize(n);
  to->resize(n);
  return true;
}

// g's nodes in a topological order (Kahn's, the driver's node order among
// those ready). Every edge is an ordering, programmatic ones included: one
// node after the other is a schedule they allow.
bool topological_order(CUgraph g, std::vector<CUgraphNode>* order) {
  std::vector<CUgraphNode> nodes, from, to;
  if (!nodes_of(g, &nodes) || !edges_of(g, &from, &to)) return false;
  std::unordered_map<CUgraphNode, size_t> index;
  for (size_t i = 0; i < nodes.size(); ++i) index[nodes[i]] = i;
  std::vector<size_t> waiting(nodes.size(), 0);
  std::vector<std::vector<size_t>> next(nodes.size());
  for (size_t e = 0; e < from.size(); ++e) {
    auto a = index.find(from[e]), b = index.find(to[e]);
    if (a == index.end() || b == index.end()) return false;
    next[a->second].push_back(b->second);
    waiting[b->second]++;
  }
  std::deque<size_t> ready;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (!waiting[i]) ready.push_back(i);
  order->clear();
  while (!ready.empty()) {
    size_t i = ready.front();
    ready.pop_front();
    order->push_back(nodes[i]);
    for (size_t j : next[i])
      if (--waiting[j] == 0) ready.push_back(j);
  }
  return order->size() == nodes.size();
}

// The node's kernel as a function of the current context (a node may hold a
// CUkernel; cuLaunchKernel takes one too where no function can be had).
CUfunction node_function(const CUDA_KERNEL_NODE_PARAMS& p) {
  if (p.func) return p.func;
  CUfunction f = nullptr;
  if (p.kern && driver().cuKernelGetFunction && driver().cuKernelGetFunction(&f, p.kern) == CUDA_SUCCESS && f) return f;
  return reinterpret_cast<CUfunction>(p.kern);
}

bool has_compile_time_cluster(CUfunction f) {
  int width = 0;
  return driver().cuFuncGetAttribute &&
         driver().cuFuncGetAttribute(&width, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, f) == CUDA_SUCCESS && width > 0;
}

// The launch attributes a kernel node carries (those set: not all zero), to
// launch it with; a device-updatable node cannot run outside its graph.
void read_node_attributes(CUgraphNode node, KernelNode& k, Plan& plan) {
  static const CUlaunchAttributeID ids[] = {
      CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
      CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
      CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
      CU_LAUNCH_ATTRIBUTE_PRIORITY,
      CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
      CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN,
      CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION,
  };
  static const CUlaunchAttributeValue zero{};
  for (CUlaunchAttributeID id : ids) {
    CUlaunchAttribute at{};
    at.id = id;
    if (driver().cuGraphKernelNodeGetAttribute(node, id, &at.value) != CUDA_SUCCESS ||
        std::memcmp(&at.value, &zero, sizeof zero) == 0)
      continue;
    if (id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION &&
        (at.value.clusterDim.x * at.value.clusterDim.y * at.value.clusterDim.z <= 1 ||
         has_compile_time_cluster(k.launch.f)))
      continue;  // no cluster, or the kernel's own (a launch may not set it again)
    k.attributes.push_back(at);
    std::string json = attribute_json(at);
    if (!json.empty()) k.launch.attributes.push_back(json);
  }
#if CUDA_VERSION >= 12080
  CUlaunchAttributeValue updatable{};
  if (driver().cuGraphKernelNodeGetAttribute(node, CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE, &updatable) ==
          CUDA_SUCCESS &&
      updatable.deviceUpdatableKernelNode.deviceUpdatable)
    refuse(plan, "the graph holds a device-updatable kernel node (its parameters may change on the device)");
#endif
}

void add_kernel_node(CUgraphNode node, Plan& plan) {
  CUDA_KERNEL_NODE_PARAMS p{};
  if (driver().cuGraphKernelNodeGetParams_v2(node, &p) != CUDA_SUCCESS) {
    refuse(plan, "the recorder cannot read a kernel node's parameters");
    return;
  }
  CUcontext current = nullptr;
  driver().cuCtxGetCurrent(&current);
  if (!p.func && p.ctx && p.ctx != current) refuse(plan, "the graph holds a kernel node of another context");
  KernelNode k;
  Launch& l = k.launch;
  l.f = node_function(p);
  l.grid[0] = p.gridDimX, l.grid[1] = p.gridDimY, l.grid[2] = p.gridDimZ;
  l.block[0] = p.blockDimX, l.block[1] = p.blockDimY, l.block[2] = p.blockDimZ;
  l.shared_mem = p.sharedMemBytes;
  l.kernel_params = p.kernelParams;  // the graph's storage: valid while the graph is
  l.extra = p.extra;
  read_node_attributes(node, k, plan);
  plan.steps.push_back(Step{node, CU_GRAPH_NODE_TYPE_KERNEL, int(plan.kernels.size())});
  plan.kernels.push_back(std::move(k));
}

// Appends g's nodes to the plan in a topological order, child graphs inlined
// where their node stands (after its dependencies, before its dependents).
void add_graph(CUgraph g, Plan& plan) {
  std::vector<CUgraphNode> order;
  if (!topological_order(g, &order)) return refuse(plan, "the recorder cannot read the graph's nodes and edges");
  for (CUgraphNode node : order) {
    CUgraphNodeType type;
    if (driver().cuGraphNodeGetType(node, &type) != CUDA_SUCCESS) {
      refuse(plan, "the recorder cannot read a node's type");
      continue;
    }
    switch (type) {
      case CU_GRAPH_NODE_TYPE_KERNEL:
        add_kernel_node(node, plan);
        break;
      case CU_GRAPH_NODE_TYPE_GRAPH: {
        CUgraph child = nullptr;
        if (driver().cuGraphChildGraphNodeGetGraph(node, &child) == CUDA_SUCCESS && child)
          add_graph(child, plan);
        else
          refuse(plan, "the recorder cannot read a child graph node");
        break;
      }
      case CU_GRAPH_NODE_TYPE_MEMCPY:
      case CU_GRAPH_NODE_TYPE_MEMSET:
      case CU_GRAPH_NODE_TYPE_HOST:
      case CU_GRAPH_NODE_TYPE_EMPTY:
      case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
        plan.steps.push_back(Step{node, type, -1});
        break;
      default:
        refuse(plan, "the graph holds " + node_kind(type));
    }
  }
}

// For a plan whose graph is not its own copy (or is gone): the arguments lived
// in it. Their prospect is then asked without them.
void forget_arguments(Plan& plan) {
  for (KernelNode& k : plan.kernels) k.launch.kernel_params = k.launch.extra = nullptr;
}

// True when none of the plan's kernel nodes can ever be recorded.
bool nothing_to_record(const Plan& plan) {
  return std::all_of(plan.kernels.begin(), plan.kernels.end(),
                     [](const KernelNode& k) { return recording_prospect(k.launch) == Prospect::never; });
}

// At instantiation (inside the CUPTI callback, in the application's context).
std::shared_ptr<Plan> make_plan(CUgraph graph) {
  auto plan = std::make_shared<Plan>();
  if (!driver_can_expand()) {  // nothing can be read: launch_graph passes it through
    plan->settled = true;
    if (!g_driver_warned.exchange(true))
      std::fprintf(stderr, "mneme record: warning: this CUDA driver lacks graph functions the recorder needs; kernels"
                           " inside CUDA graphs are not recorded\n");
    return plan;
  }
  CUresult r = driver().cuGraphClone(&plan->copy, graph);
  if (r == CUDA_SUCCESS) {
    add_graph(plan->copy, *plan);
  } else {
    // Graphs with memory allocation, free or conditional nodes cannot be
    // cloned: read the application's graph for the warnings, keeping nothing
    // that lives in it.
    plan->copy = nullptr;
    add_graph(graph, *plan);
    plan->steps.clear();
    forget_arguments(*plan);
    refuse(*plan, std::string("the recorder cannot copy the graph (") + error_string(r) + ")");
  }
  if (nothing_to_record(*plan)) {  // the common case of a filter: keep no copy
    plan->settled = true;
    plan->steps.clear();
    forget_arguments(*plan);
    if (plan->copy) driver().cuGraphDestroy(plan->copy);
    plan->copy = nullptr;
  }
  return plan;
}

// ---- deciding -------------------------------------------------------------

bool capturing(CUstream stream) {
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  return driver().cuStreamIsCapturing(stream, &cs) == CUDA_SUCCESS && cs != CU_STREAM_CAPTURE_STATUS_NONE;
}

void warn_unknown_exec() {
  if (!g_unknown_warned.exchange(true))
    std::fprintf(stderr, "mneme record: warning: a CUDA graph whose instantiation the recorder did not see is launched"
                         " whole; its kernels are not recorded\n");
}

// Under g_mu: whether this launch of the plan's graph runs node by node. A
// plan none of whose kernel nodes may be recorded now is settled (its kernels'
// instances are used up or recorded with these arguments): later launches go
// to the driver at once. One that cannot run node by node names, once, each
// kernel node that would have been recorded.
bool wants_expansion(Plan& plan) {
  std::vector<const KernelNode*> wanted;
  for (const KernelNode& k : plan.kernels)
    if (recording_prospect(k.launch) == Prospect::maybe) wanted.push_back(&k);
  if (!wanted.empty() && plan.refusal.empty()) return true;
  for (const KernelNode* k : wanted)
    std::fprintf(stderr, "mneme record: warning: %s, a kernel node of a CUDA graph, is not recorded: %s; the graph is"
                 " launched whole\n", kernel_name(k->launch.f).c_str(), plan.refusal.c_str());
  plan.settled = true;
  return false;
}

std::shared_ptr<Plan> plan_to_expand(CUgraphExec exec, CUstream stream) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_plans.find(exec);
  if (it == g_plans.end()) {
    warn_unknown_exec();
    return nullptr;
  }
  Plan& plan = *it->second;
  if (plan.settled || capturing(stream)) return nullptr;  // into a capture: it becomes a child graph node
  return wants_expansion(plan) ? it->second : nullptr;
}

// ---- running --------------------------------------------------------------

CUresult run_kernel(const KernelNode& k, CUstream stream) {
  const Launch& l = k.launch;
  auto& d = driver();
  if (k.attributes.empty())
    return d.cuLaunchKernel(l.f, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2], l.shared_mem,
                            stream, l.kernel_params, l.extra);
  CUlaunchConfig c{};
  c.gridDimX = l.grid[0], c.gridDimY = l.grid[1], c.gridDimZ = l.grid[2];
  c.blockDimX = l.block[0], c.blockDimY = l.block[1], c.blockDimZ = l.block[2];
  c.sharedMemBytes = l.shared_mem;
  c.hStream = stream;
  c.attrs = const_cast<CUlaunchAttribute*>(k.attributes.data());
  c.numAttrs = unsigned(k.attributes.size());
  return d.cuLaunchKernelEx(&c, l.f, l.kernel_params, l.extra);
}

CUresult run_memset(CUgraphNode node, CUstream stream) {
  auto& d = driver();
  CUDA_MEMSET_NODE_PARAMS p{};
  if (CUresult r = d.cuGraphMemsetNodeGetParams(node, &p); r != CUDA_SUCCESS) return r;
  const bool rows = p.height > 1;
  switch (p.elementSize) {
    case 1:
      return rows ? d.cuMemsetD2D8Async(p.dst, p.pitch, (unsigned char)p.value, p.width, p.height, stream)
                  : d.cuMemsetD8Async(p.dst, (unsigned char)p.value, p.width, stream);
    case 2:
      return rows ? d.cuMemsetD2D16Async(p.dst, p.pitch, (unsigned short)p.value, p.width, p.height, stream)
                  : d.cuMemsetD16Async(p.dst, (unsigned short)p.value, p.width, stream);
    case 4:
      return rows ? d.cuMemsetD2D32Async(p.dst, p.pitch, p.value, p.width, p.height, stream)
                  : d.cuMemsetD32Async(p.dst, p.value, p.width, stream);
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult run_step(const Plan& plan, const Step& s, CUstream stream) {
  auto& d = driver();
  switch (s.type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
      return run_kernel(plan.kernels[s.kernel], stream);
    case CU_GRAPH_NODE_TYPE_MEMSET:
      return run_memset(s.node, stream);
    case CU_GRAPH_NODE_TYPE_MEMCPY: {
      CUDA_MEMCPY3D p{};
      CUresult r = d.cuGraphMemcpyNodeGetParams(s.node, &p);
      return r != CUDA_SUCCESS ? r : d.cuMemcpy3DAsync_v2(&p, stream);
    }
    case CU_GRAPH_NODE_TYPE_HOST: {  // stream-ordered, as in the graph: after the nodes before it
      CUDA_HOST_NODE_PARAMS p{};
      CUresult r = d.cuGraphHostNodeGetParams(s.node, &p);
      return r != CUDA_SUCCESS ? r : d.cuLaunchHostFunc(stream, p.fn, p.userData);
    }
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: {
      CUevent e = nullptr;
      CUresult r = d.cuGraphEventWaitNodeGetEvent(s.node, &e);
      return r != CUDA_SUCCESS ? r : d.cuStreamWaitEvent(stream, e, 0);
    }
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD: {
      CUevent e = nullptr;
      CUresult r = d.cuGraphEventRecordNodeGetEvent(s.node, &e);
      return r != CUDA_SUCCESS ? r : d.cuEventRecord(e, stream);
    }
    default:  // empty nodes
      return CUDA_SUCCESS;
  }
}

// Every node is queued before any waits (the recorder's own synchronization
// at a recorded kernel aside), so event waits see the records they would see
// at the graph's launch.
CUresult run_plan(const Plan& plan, CUstream stream) {
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    CUresult r = run_step(plan, plan.steps[i], stream);
    if (r != CUDA_SUCCESS) {
      std::fprintf(stderr, "mneme record: warning: running a CUDA graph node by node failed at node %zu of %zu (%s);"
                   " the launch returns that error\n", i + 1, plan.steps.size(), error_string(r));
      return r;
    }
  }
  return CUDA_SUCCESS;
}

// ---- instances: created, changed, destroyed --------------------------------

void on_instantiated(CUgraphExec exec, CUgraph graph) {
  std::shared_ptr<Plan> plan = make_plan(graph);  // outside g_mu: it asks launch_recorder
  std::lock_guard<std::mutex> lock(g_mu);
  g_plans[exec] = std::move(plan);
}

void on_changed(CUgraphExec exec, const char* api) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_plans.find(exec);
  if (it == g_plans.end()) return;
  refuse(*it->second, std::string("the application changed the instance after instantiation (") + (api ? api : "?") +
                          "), which the recorder does not follow");
  it->second->settled = false;  // its next launch names the kernel nodes this leaves unrecorded
}

void on_destroyed(CUgraphExec exec) {
  std::shared_ptr<Plan> plan;  // destroyed outside g_mu
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_plans.find(exec);
  if (it == g_plans.end()) return;
  plan = std::move(it->second);
  g_plans.erase(it);
}

void on_bypassing_launch() {
  g_launches++;
  if (!g_bypass_warned.exchange(true))
    std::fprintf(stderr, "mneme record: warning: a CUDA graph was launched past the recorder's cuGraphLaunch; kernels"
                         " inside it are not recorded\n");
}

// The parameters these callbacks read; each API's parameter struct starts so.
struct InstantiateParams {
  CUgraphExec* exec;
  CUgraph graph;
};
struct UpdateParams {
  CUgraphExec exec;
  CUgraph graph;
};
struct ExecParams {
  CUgraphExec exec;
};

bool succeeded(const CUpti_CallbackData* cb) {
  return cb->callbackSite == CUPTI_API_EXIT && *static_cast<const CUresult*>(cb->functionReturnValue) == CUDA_SUCCESS;
}

}  // namespace

CUresult launch_graph(CUgraphExec exec, CUstream stream, GraphLaunchFn real, bool per_thread_stream) {
  if (per_thread_stream && !stream) stream = CU_STREAM_PER_THREAD;  // what the _ptsz entry point means by 0
  // Counted at the recording gate for the whole launch, node by node or whole.
  struct GateCount {
    GateCount() { enter_graph_launch(); }
    ~GateCount() { leave_graph_launch(); }
  } counted;
  std::shared_ptr<Plan> plan = plan_to_expand(exec, stream);
  if (!plan) {
    t_in_wrapper = true;
    CUresult r = real(exec, stream);
    t_in_wrapper = false;
    g_launches++;
    return r;
  }
  g_launches++;
  g_expanded++;
  if (settings().verbose)
    std::fprintf(stderr, "mneme record: a CUDA graph runs node by node (%zu nodes, %zu kernels)\n", plan->steps.size(),
                 plan->kernels.size());
  return run_plan(*plan, stream);
}

const std::vector<CUpti_CallbackId>& graph_callback_ids() {
  static const std::vector<CUpti_CallbackId> ids = {
      CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate,
      CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate_v2,
      CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithFlags,
      CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams,
      CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams_ptsz,
      CUPTI_DRIVER_TRACE_CBID_cuGraphExecUpdate,
      CUPTI_DRIVER_TRACE_CBID_cuGraphExecUpdate_v2,
      CUPTI_DRIVER_TRACE_CBID_cuGraphExecKernelNodeSetParams,
      CUPTI_DRIVER_TRACE_CBID_cuGraphExecKernelNodeSetParams_v2,
      CUPTI_DRIVER_TRACE_CBID_cuGraphExecMemcpyNodeSetParams,
      CUPTI_DRIVER_TRACE_CBID_cuGraphExecMemsetNodeSetParams,
      CUPTI_DRIVER_TRACE_CBID_cuGraphExecHostNodeSetParams,
      CUPTI_DRIVER_TRACE_CBID_cuGraphExecChildGraphNodeSetParams,
      CUPTI_DRIVER_TRACE_CBID_cuGraphExecEventRecordNodeSetEvent,
      CUPTI_DRIVER_TRACE_CBID_cuGraphExecEventWaitNodeSetEvent,
      CUPTI_DRIVER_TRACE_CBID_cuGraphExecExternalSemaphoresSignalNodeSetParams,
      CUPTI_DRIVER_TRACE_CBID_cuGraphExecExternalSemaphoresWaitNodeSetParams,
      CUPTI_DRIVER_TRACE_CBID_cuGraphExecBatchMemOpNodeSetParams,
      CUPTI_DRIVER_TRACE_CBID_cuGraphExecNodeSetParams,
      CUPTI_DRIVER_TRACE_CBID_cuGraphNodeSetEnabled,
      CUPTI_DRIVER_TRACE_CBID_cuGraphExecDestroy,
      CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
      CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
  };
  return ids;
}

bool on_graph_callback(CUpti_CallbackId cbid, const CUpti_CallbackData* cb) {
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithFlags:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams_ptsz: {
      auto* p = static_cast<const InstantiateParams*>(cb->functionParams);
      if (succeeded(cb) && p->exec) on_instantiated(*p->exec, p->graph);
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecUpdate:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecUpdate_v2: {  // the instance now runs the new graph's parameters
      auto* p = static_cast<const UpdateParams*>(cb->functionParams);
      if (succeeded(cb)) on_instantiated(p->exec, p->graph);
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecKernelNodeSetParams:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecKernelNodeSetParams_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecMemcpyNodeSetParams:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecMemsetNodeSetParams:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecHostNodeSetParams:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecChildGraphNodeSetParams:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecEventRecordNodeSetEvent:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecEventWaitNodeSetEvent:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecExternalSemaphoresSignalNodeSetParams:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecExternalSemaphoresWaitNodeSetParams:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecBatchMemOpNodeSetParams:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecNodeSetParams:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphNodeSetEnabled:
      if (succeeded(cb)) on_changed(static_cast<const ExecParams*>(cb->functionParams)->exec, cb->functionName);
      return true;
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecDestroy:
      if (cb->callbackSite == CUPTI_API_ENTER) on_destroyed(static_cast<const ExecParams*>(cb->functionParams)->exec);
      return true;
    case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz:
      if (cb->callbackSite == CUPTI_API_ENTER && !t_in_wrapper) on_bypassing_launch();
      return true;
    default:
      return false;
  }
}

long graph_launches() { return g_launches.load(); }
long graph_launches_expanded() { return g_expanded.load(); }

}  // namespace mneme::rec
