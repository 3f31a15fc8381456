#include "launch_recorder.hpp"

#include <cxxabi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "mneme/common/driver_api.hpp"
#include "mneme/common/elf_symbols.hpp"
#include "mneme/common/settings.hpp"
#include "mneme/common/text.hpp"

#include "annotations.hpp"
#include "code_images.hpp"
#include "graph_expansion.hpp"
#include "memory_window.hpp"
#include "name_filter.hpp"
#include "pool_allocators.hpp"
#include "spool.hpp"
#include "uncaptured.hpp"
#include "usage_warnings.hpp"

using namespace mneme::common;

namespace mneme::rec {
namespace {

struct ModuleInfo {
  uint32_t id = 0;
  std::unordered_set<std::string> kernels;
  std::vector<std::string> globals;
};

struct KernelState {
  std::string name;
  bool selected = false;
  std::atomic<bool> finished{false};  // nothing more will be recorded: skip without locking
  long launches = 0;
  long recorded = 0;
  bool capture_noted = false;  // stderr said once that its captured launches are recorded later
  // Launches whose prologue is on file and whose epilogue is not yet: they hold
  // instance slots (recorded + pending <= -mr), so two threads launching the
  // kernel at once cannot both take its last slot.
  long pending = 0;
  std::unordered_set<uint64_t> seen;  // launch-identity hashes recorded or pending
};

struct FunctionInfo {
  KernelState* kernel = nullptr;
  bool layout_known = false;
  std::vector<std::pair<size_t, size_t>> params;  // offset, size
  size_t param_buffer_size = 0;
};

struct Pending {
  // Which launch this is: its exit callback must name the same (the stale
  // pending of a launch whose exit never came is dropped, never committed).
  CUpti_CallbackId cbid = 0;
  CUfunction f = nullptr;
  uint64_t token = 0;  // also in the launch's CUPTI correlationData
  int stripes = 0;     // of the prologue; the epilogue repeats them
  bool identity_reserved = false;  // `identity` went into kernel->seen at the prologue
  std::string tmp_dir, final_dir;
  std::string launch_json_head;  // everything known before the launch
  std::vector<DeviceRegion> regions;
  std::vector<std::pair<uint64_t, uint64_t>> foreign_refs;  // (region base, value): pointers into uncaptured memory
  KernelState* kernel = nullptr;
  uint64_t identity = 0;
  uint64_t prologue_bytes = 0;
  double prologue_seconds = 0;
  double prologue_writer_wait = 0, prologue_copy_wait = 0, prologue_setup = 0, prologue_write = 0;
  double spool_wait = 0;  // back-pressure: waited for the agent to convert earlier entries
  uint64_t prologue_copied = 0;
  double prologue_digest = 0;
  DigestSet new_digests;  // of the pieces this entry copied (remembered once it is committed)
  std::vector<std::string> warnings;
};

// Serializes recording and the tables below. Recursive: recording a launch may
// load its module (lazy loading), and the module-loaded callback comes inside
// that call, on this thread.
using Lock = std::lock_guard<std::recursive_mutex>;
std::recursive_mutex g_mu;
std::deque<ModuleInfo> g_modules;  // a deque: a module loading mid-recording moves no entry
std::set<uint32_t> g_modules_written;
std::unordered_map<std::string, std::unique_ptr<KernelState>> g_kernels;
std::unordered_map<CUfunction, FunctionInfo> g_functions;
std::map<CUcontext, std::unique_ptr<SnapshotWriter>> g_writers;
std::unordered_map<std::string, bool> g_name_selected;  // the filter's verdict, once per name
// Launch callbacks are switched on only while a loaded kernel may still be
// recorded: a selected, unfinished kernel of a loaded module, or a module
// whose kernels could not be read. Otherwise launches run without CUPTI.
void (*g_launch_switch)(bool) = nullptr;
bool g_launch_callbacks_on = false;
bool g_unknown_module = false;
std::set<std::string> g_candidates;  // selected kernels defined by loaded modules
// Launches between prologue and epilogue, all threads: their exit callbacks
// must come, so the launch callbacks stay on while any is in flight.
long g_in_flight = 0;
uint64_t g_launch_token = 0;
std::atomic<bool> g_disabled{false};
std::atomic<long> g_seq{0}, g_launches_seen{0}, g_recorded{0};
std::vector<std::pair<std::string, uint64_t>> g_committed;  // entry dir, bytes (back-pressure)
std::string g_error;

thread_local const void* t_loading_image = nullptr;
thread_local bool t_module_loaded = false;    // a module-loaded callback came during the current load call
// The image of the kernel this thread is launching (looked up at a kernel's
// first launch on the thread, when lazy loading may load its module inside the
// launch: the module-loaded callback makes no driver call of its own).
thread_local const void* t_launch_image = nullptr;
// While the recorder takes a snapshot: a module loading then is its own (the
// digest kernel's), not the application's. Module loads inside its other
// driver calls (loading the recorded kernel, asking for its name or module)
// are the application's.
thread_local bool t_writing_snapshot = false;
struct WritingSnapshot {
  WritingSnapshot() { t_writing_snapshot = true; }
  ~WritingSnapshot() { t_writing_snapshot = false; }
};
thread_local std::unique_ptr<Pending> t_pending;

std::string spool(const std::string& rel) { return settings().spool_dir + "/" + rel; }

void stop_recording(const std::string& why) {
  if (g_disabled.exchange(true)) return;
  g_error = why;
  std::fprintf(stderr, "mneme record: error: %s; recording stopped, the application continues unrecorded\n", why.c_str());
  std::string body = "{\"error\": " + json_string(why) + "}\n", ignored;
  write_file_atomic(spool("error.json"), body.data(), body.size(), &ignored);
}

bool name_matches(const std::string& name) {
  static const NameFilter filter(settings().kernel_regexes);
  return filter.matches(name);
}

bool name_selected(const std::string& name) {
  auto it = g_name_selected.find(name);
  if (it == g_name_selected.end()) it = g_name_selected.emplace(name, name_matches(name)).first;
  return it->second;
}

// Under g_mu: launch callbacks on while something loaded may still be recorded.
// Under lazy module loading a module loads at the first launch of one of its
// kernels, after that launch's enter callback, so its kernels are unknown
// until then: every launch is watched (a kernel the filter rejected costs one
// thread-local lookup).
void update_launch_callbacks() {
  bool want = !settings().eager_loading || g_unknown_module || g_in_flight > 0;
  for (auto it = g_candidates.begin(); !want && it != g_candidates.end(); ++it) {
    auto k = g_kernels.find(*it);
    want = k == g_kernels.end() || !k->second->finished;
  }
  if (want == g_launch_callbacks_on || !g_launch_switch) return;
  g_launch_switch(want);
  g_launch_callbacks_on = want;
  if (settings().verbose)
    std::fprintf(stderr, "mneme record: launch callbacks %s\n", want ? "on" : "off (no loaded kernel left to record)");
}

bool index_selected(long index) {
  const Settings& s = settings();
  if (index < s.skip) return false;
  if (s.instances.empty()) return true;
  for (const auto& sl : s.instances) {
    if (index < sl.start || (sl.stop >= 0 && index >= sl.stop)) continue;
    if ((index - sl.start) % sl.step == 0) return true;
  }
  return false;
}

FunctionInfo& function_info(CUfunction f, const char* symbol_name) {
  auto it = g_functions.find(f);
  if (it != g_functions.end()) return it->second;
  FunctionInfo info;
  std::string name = symbol_name ? symbol_name : "";
  const char* n = nullptr;
  if (name.empty() && driver().cuFuncGetName && driver().cuFuncGetName(&n, f) == CUDA_SUCCESS && n) name = n;
  if (name.empty() && driver().cuKernelGetName &&  // a CUkernel (cudart's handles)
      driver().cuKernelGetName(&n, reinterpret_cast<CUkernel>(f)) == CUDA_SUCCESS && n)
    name = n;
  auto& ks = g_kernels[name];
  if (!ks) {
    ks = std::make_unique<KernelState>();
    ks->name = name;
    ks->selected = !name.empty() && name_selected(name);  // a kernel without a name cannot be recorded
    if (name.empty()) std::fprintf(stderr, "mneme record: warning: a launched kernel has no name; it is not recorded\n");
  }
  info.kernel = ks.get();
  return g_functions.emplace(f, std::move(info)).first->second;
}

// cudart (CUDA 12+) launches CUkernel handles through cuLaunchKernel; the
// driver accepts both kinds of handle there, so the queries try both.
CUresult param_info(CUfunction f, size_t i, size_t* off, size_t* size) {
  CUresult r = driver().cuFuncGetParamInfo(f, i, off, size);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_INVALID_VALUE && driver().cuKernelGetParamInfo) {
    CUresult k = driver().cuKernelGetParamInfo(reinterpret_cast<CUkernel>(f), i, off, size);
    if (k == CUDA_SUCCESS || k == CUDA_ERROR_INVALID_VALUE) return k;
  }
  return r;
}

CUmodule module_handle(CUfunction f) {
  CUmodule m = nullptr;
  auto& d = driver();
  if (!d.cuFuncGetModule) return nullptr;
  if (d.cuFuncGetModule(&m, f) == CUDA_SUCCESS && m) return m;
  CUfunction in_context = nullptr;
  if (d.cuKernelGetFunction && d.cuKernelGetFunction(&in_context, reinterpret_cast<CUkernel>(f)) == CUDA_SUCCESS &&
      d.cuFuncGetModule(&m, in_context) == CUDA_SUCCESS)
    return m;
  return nullptr;
}

CUresult resolve_layout(CUfunction f, FunctionInfo& info) {
  if (info.layout_known || !driver().cuFuncGetParamInfo) return CUDA_SUCCESS;
  info.params.clear();
  info.param_buffer_size = 0;
  for (size_t i = 0;; ++i) {
    size_t off = 0, size = 0;
    CUresult r = param_info(f, i, &off, &size);
    if (r == CUDA_ERROR_INVALID_VALUE) break;  // past the last parameter
    if (r != CUDA_SUCCESS) return r;             // layout not available (lazy loading)
    info.params.emplace_back(off, size);
    info.param_buffer_size = std::max(info.param_buffer_size, off + size);
  }
  info.layout_known = true;
  return CUDA_SUCCESS;
}

bool param_bytes(const Launch& l, const FunctionInfo& info, std::vector<unsigned char>* out) {
  out->assign(info.param_buffer_size, 0);
  if (l.kernel_params) {
    for (size_t i = 0; i < info.params.size(); ++i)
      std::memcpy(out->data() + info.params[i].first, l.kernel_params[i], info.params[i].second);
    return true;
  }
  if (l.extra) {
    void* buffer = nullptr;
    size_t size = 0;
    for (void** e = l.extra; *e != CU_LAUNCH_PARAM_END; e += 2) {
      if (*e == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = e[1];
      else if (*e == CU_LAUNCH_PARAM_BUFFER_SIZE) size = *static_cast<size_t*>(e[1]);
    }
    if (!buffer) return false;
    out->assign(static_cast<unsigned char*>(buffer), static_cast<unsigned char*>(buffer) + size);
    return true;
  }
  return info.param_buffer_size == 0;
}

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

const ModuleInfo* module_of(const std::string& kernel) {
  for (auto it = g_modules.rbegin(); it != g_modules.rend(); ++it)
    if (it->kernels.count(kernel)) return &*it;
  return nullptr;
}

void wait_for_spool_room() {
  // Back-pressure: the agent deletes entries it has converted.
  for (;;) {
    uint64_t total = 0;
    std::vector<std::pair<std::string, uint64_t>> still;
    for (auto& [dir, bytes] : g_committed) {
      struct stat st;
      if (stat(dir.c_str(), &st) == 0) {
        still.emplace_back(dir, bytes);
        total += bytes;
      }
    }
    g_committed.swap(still);
    if (total <= settings().spool_max_bytes || g_committed.empty()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Managed pages may sit in host memory: the captured ones move to the device
// first, in one bulk migration, rather than a page fault at a time under the
// digest kernel (copies would fetch them either way). Best effort: without
// prefetch support the snapshot reads them where they are.
void prefetch_managed(const std::vector<DeviceRegion>& regions, const std::vector<Allocation>& allocations,
                      CUdevice device) {
  auto& d = driver();
  std::set<uint64_t> managed;
  for (const auto& a : allocations)
    if (a.managed) managed.insert(a.base);
  if (managed.empty() || !d.cuMemPrefetchAsync_v2) return;
  CUmemLocation to{};
  to.type = CU_MEM_LOCATION_TYPE_DEVICE;
  to.id = int(device);
  bool queued = false;
  for (const auto& r : regions)
    if (r.kind == "heap" && managed.count(r.base))
      queued |= d.cuMemPrefetchAsync_v2(r.base, r.size, to, 0, nullptr) == CUDA_SUCCESS;
  if (queued) d.cuCtxSynchronize();
}

void add_region_once(std::vector<DeviceRegion>& regions, std::set<uint64_t>& bases, const Allocation& a) {
  if (a.size == 0 || !bases.insert(a.base).second) return;
  regions.push_back(DeviceRegion{a.base, a.size, "heap", "", {}});
}

std::string dims_json(const unsigned v[3]) {
  return "[" + std::to_string(v[0]) + ", " + std::to_string(v[1]) + ", " + std::to_string(v[2]) + "]";
}

// Per phase, the pieces' digests and the indices of those not copied (when digests were computed).
std::string phase_digests_json(const std::vector<Piece>& pieces, bool digests) {
  std::string out = "{\"digests\": [", skipped = "], \"skipped\": [";
  bool first_skip = true;
  for (size_t k = 0; k < pieces.size(); ++k) {
    out += (k ? ", \"" : "\"") + (digests ? digest_hex(pieces[k].digest) : std::string()) + "\"";
    if (!pieces[k].copied) {
      skipped += (first_skip ? "" : ", ") + std::to_string(k);
      first_skip = false;
    }
  }
  return out + skipped + "]}";
}

bool has_digests(const std::vector<Piece>& pieces) {
  return !pieces.empty() && std::all_of(pieces.begin(), pieces.end(), [](const Piece& p) { return p.has_digest; });
}

// The regions with their layout (`pieces`: the same in both phases) and, where
// the GPU computed digests, per phase which pieces were not copied.
std::string regions_json(const std::vector<DeviceRegion>& regions, const std::vector<std::vector<Piece>>& prologue_pieces) {
  std::string out = "[";
  for (size_t i = 0; i < regions.size(); ++i) {
    const auto& r = regions[i];
    out += (i ? ", " : "") + std::string("{\"kind\": ") + json_string(r.kind) + ", \"name\": " + json_string(r.name) +
           ", \"base\": " + std::to_string(r.base) + ", \"size\": " + std::to_string(r.size) + ", \"pieces\": [";
    for (size_t k = 0; k < r.pieces.size(); ++k)
      out += (k ? ", [" : "[") + std::to_string(r.pieces[k].stripe) + ", " + std::to_string(r.pieces[k].offset) + ", " +
             std::to_string(r.pieces[k].size) + "]";
    out += "]";
    const auto& pro = prologue_pieces[i];
    if (has_digests(pro) || has_digests(r.pieces))
      out += ", \"prologue\": " + phase_digests_json(pro, has_digests(pro)) + ", \"epilogue\": " +
             phase_digests_json(r.pieces, has_digests(r.pieces));
    std::string policy = r.kind == "heap" ? policy_json(r.base) : "";
    out += policy.empty() ? "}" : ", \"policy\": " + policy + "}";
  }
  return out + "]";
}

std::string strings_json(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + json_string(v[i]);
  return out + "]";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

SnapshotWriter& writer_for_current_context() {
  CUcontext ctx = nullptr;
  driver().cuCtxGetCurrent(&ctx);
  auto& w = g_writers[ctx];
  if (!w) w = std::make_unique<SnapshotWriter>();
  return *w;
}

// Called at API enter of a launch: decide, then capture the prologue.
// Launches of kernels the filter rejected (or that are done) take this path on
// every call: one thread-local hash lookup, no lock.
thread_local std::unordered_map<CUfunction, const KernelState*> t_known;

// Every watched launch comes here first: false for a kernel this thread knows
// the filter rejected (or that has its instances), before anything is decoded.
bool launch_needs_look(CUfunction f) {
  g_launches_seen++;
  if (g_disabled) return false;
  auto known = t_known.find(f);
  return known == t_known.end() ||
         (known->second->selected && !known->second->finished.load(std::memory_order_relaxed));
}

// The current context's device, and whether --devices selects it.
bool device_selected(CUdevice* device) {
  *device = 0;
  driver().cuCtxGetDevice(device);
  const auto& devices = settings().devices;
  return devices.empty() || std::find(devices.begin(), devices.end(), int(*device)) != devices.end();
}

// What makes two launches of a kernel the same instance.
uint64_t launch_identity(const Launch& l, const std::vector<unsigned char>& args) {
  uint64_t identity = 1469598103934665603ull;
  identity = fnv1a(identity, l.grid, sizeof l.grid);
  identity = fnv1a(identity, l.block, sizeof l.block);
  identity = fnv1a(identity, &l.shared_mem, sizeof l.shared_mem);
  identity = fnv1a(identity, args.data(), args.size());
  for (const std::string& a : l.attributes) identity = fnv1a(identity, a.data(), a.size());  // cluster dims, ...
  return identity;
}

// A launch into a stream capture does not run: it becomes a kernel node of
// the graph, recorded when the graph is launched (graph_expansion.cpp).
bool captured_into_graph(CUstream stream, KernelState& ks) {
  auto& d = driver();
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  if (!d.cuStreamIsCapturing || d.cuStreamIsCapturing(stream, &cs) != CUDA_SUCCESS || cs == CU_STREAM_CAPTURE_STATUS_NONE)
    return false;
  if (!ks.capture_noted)
    std::fprintf(stderr, "mneme record: %s: a launch captured into a CUDA graph is recorded when the graph is"
                 " launched, not at capture\n", ks.name.c_str());
  ks.capture_noted = true;
  return true;
}

void before_launch(const Launch& l, const char* symbol_name) {
  Lock lock(g_mu);
  FunctionInfo& info = function_info(l.f, symbol_name);
  KernelState& ks = *info.kernel;
  t_known[l.f] = &ks;
  if (!settings().eager_loading) t_launch_image = image_of_function(l.f);
  if (ks.selected && captured_into_graph(l.stream, ks)) return;
  long index = ks.launches++;
  if (!ks.selected || !index_selected(index)) return;
  if (settings().max_instances > 0 && ks.recorded + ks.pending >= settings().max_instances) return;
  if (access(spool("stop").c_str(), F_OK) == 0) {  // the agent cannot store more
    stop_recording("the record agent asked to stop (see its message)");
    return;
  }
  auto& d = driver();
  CUdevice device = 0;
  if (!device_selected(&device)) return;
  // Lazy loading: the kernel's module may not be in this context yet; load it
  // now (its module-loaded callback runs inside) so that its code, globals and
  // parameter layout are known before the prologue.
  if (!module_of(ks.name)) load_function(l.f);
  CUresult lr = resolve_layout(l.f, info);
  if (!info.layout_known) {
    std::fprintf(stderr, "mneme record: warning: %s launch %ld not recorded: parameter layout unknown (%s; record"
                 " with --eager-loading)\n", ks.name.c_str(), index, error_string(lr));
    return;
  }
  std::vector<unsigned char> args;
  if (!param_bytes(l, info, &args)) {
    std::fprintf(stderr, "mneme record: warning: %s launch %ld not recorded: cannot read its arguments\n",
                 ks.name.c_str(), index);
    return;
  }
  const uint64_t identity = launch_identity(l, args);
  if (!settings().record_duplicates && ks.seen.count(identity)) return;
  CUresult sr = d.cuCtxSynchronize();
  if (sr != CUDA_SUCCESS) {
    std::fprintf(stderr, "mneme record: warning: %s launch %ld not recorded: the context reports %s before it\n",
                 ks.name.c_str(), index, error_string(sr));
    return;
  }

  auto p = std::make_unique<Pending>();
  p->kernel = &ks;
  p->identity = identity;
  p->warnings = active_usage_warnings();
  if (l.extra && !l.kernel_params) p->warnings.push_back("arguments passed through the `extra` buffer");

  // Regions: module globals first, then heap allocations.
  std::set<uint64_t> bases;
  const ModuleInfo* mod = module_of(ks.name);
  const long module_id = mod ? long(mod->id) : -1;
  CUmodule hmod = mod ? module_handle(l.f) : nullptr;
  if (hmod) {
    for (const auto& g : mod->globals) {
      CUdeviceptr gp = 0;
      size_t gsize = 0;
      if (d.cuModuleGetGlobal_v2(&gp, &gsize, hmod, g.c_str()) == CUDA_SUCCESS && gsize && bases.insert(gp).second)
        p->regions.push_back(DeviceRegion{gp, gsize, "global", g, {}});
    }
  }
  auto allocations = MemoryWindow::instance().live_allocations(device);
  // --snapshot-scope auto: the reachable allocations where a pool allocator
  // holds the memory (the whole pool is GBs; a kernel reaches MBs of it).
  std::string pool;
  if (settings().snapshot_scope == "auto") {
    bool inside_large = false;
    for (size_t off = 0; !inside_large && off + 8 <= args.size(); off += 8) {
      uint64_t v;
      std::memcpy(&v, args.data() + off, 8);
      Allocation a;
      inside_large = MemoryWindow::instance().find(v, &a) && a.size >= kPoolRegionBytes && v != a.base;
    }
    pool = pool_allocator(inside_large);
  }
  const bool reachable = settings().snapshot_scope == "reachable" || !pool.empty();
  if (!reachable) {
    for (const auto& a : allocations) add_region_once(p->regions, bases, a);
  } else {
    for (size_t off = 0; off + 8 <= args.size(); off += 8) {  // pointer-sized, aligned argument words
      uint64_t v;
      std::memcpy(&v, args.data() + off, 8);
      Allocation a;
      if (MemoryWindow::instance().find(v, &a)) add_region_once(p->regions, bases, a);
    }
  }

  long seq = g_seq++;
  char name[32];
  std::snprintf(name, sizeof name, "%08ld", seq);
  p->final_dir = spool(std::string("entries/") + name);
  p->tmp_dir = p->final_dir + ".tmp";
  const auto wait_start = std::chrono::steady_clock::now();
  wait_for_spool_room();
  p->spool_wait = seconds_since(wait_start);
  if (!make_dirs(p->tmp_dir)) {
    stop_recording("cannot create the spool directory " + p->tmp_dir + ": " + std::strerror(errno));
    return;
  }
  // Reachable scope follows the pointers it reads; either scope notes pointers into
  // memory it does not capture (managed, mapped host, IPC), so the agent can refuse the launch.
  const bool foreign = !foreign_ranges().empty();
  auto scan = [&](const DeviceRegion& region, const unsigned char* bytes, size_t n) {
    for (size_t off = 0; off + 8 <= n; off += 8) {
      uint64_t v;
      std::memcpy(&v, bytes + off, 8);
      if (v < 4096) continue;
      Allocation a;
      if (reachable && MemoryWindow::instance().find(v, &a)) add_region_once(p->regions, bases, a);
      else if (foreign && p->foreign_refs.size() < 8 && find_foreign(v, nullptr)) p->foreign_refs.emplace_back(region.base, v);
    }
  };
  auto t0 = std::chrono::steady_clock::now();
  prefetch_managed(p->regions, allocations, device);
  std::string error;
  std::function<void(const DeviceRegion&, const unsigned char*, size_t)> scanner;
  if (reachable || foreign) scanner = scan;
  bool written;
  {
    WritingSnapshot writing;
    written = writer_for_current_context().write(p->tmp_dir + "/prologue", p->regions, scanner,
                                                 settings().max_snapshot_bytes, &p->prologue_bytes, &error,
                                                 &p->new_digests);
  }
  if (!written) {
    remove_tree(p->tmp_dir);
    if (error == "snapshot exceeds the byte cap") {
      std::fprintf(stderr, "mneme record: warning: %s launch %ld not recorded: its snapshot exceeds"
                   " --max-snapshot-bytes=%llu (try --snapshot-scope reachable)\n", ks.name.c_str(), index,
                   (unsigned long long)settings().max_snapshot_bytes);
      return;
    }
    stop_recording(error);
    return;
  }
  p->prologue_seconds = seconds_since(t0);
  p->prologue_writer_wait = writer_for_current_context().last_writer_wait_seconds();
  p->prologue_copy_wait = writer_for_current_context().last_copy_wait_seconds();
  p->prologue_setup = writer_for_current_context().last_setup_seconds();
  p->prologue_write = writer_for_current_context().last_write_seconds();
  p->prologue_copied = writer_for_current_context().last_copied_bytes();
  p->prologue_digest = writer_for_current_context().last_digest_seconds();

  // Metadata known before the launch.
  char arch[16], dname[256] = "";
  int major = 0, minor = 0;
  d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
  d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
  std::snprintf(arch, sizeof arch, "sm_%d%d", major, minor);
  d.cuDeviceGetName(dname, sizeof dname, device);
  std::vector<std::string> offsets, sizes;
  std::ostringstream os;
  p->stripes = writer_for_current_context().last_stripes();
  os << "{\"format\": \"mneme-spool-entry/3\", \"stripes\": " << p->stripes << ", \"seq\": " << seq << ", \"pid\": " << getpid()
     << ", \"rank\": " << json_string(settings().rank) << ", \"kernel\": " << json_string(ks.name)
     << ", \"demangled\": " << json_string(demangle(ks.name)) << ", \"api\": " << json_string(l.api)
     << ", \"launch_index\": " << index << ", \"identity\": \"" << std::hex << identity << std::dec << "\""
     << ", \"device\": " << device << ", \"device_name\": " << json_string(dname) << ", \"arch\": \"" << arch << "\""
     << ", \"grid\": " << dims_json(l.grid) << ", \"block\": " << dims_json(l.block)
     << ", \"shared_mem\": " << l.shared_mem << ", \"module_id\": " << module_id
     << ", \"param_offsets\": [";
  for (size_t i = 0; i < info.params.size(); ++i) os << (i ? ", " : "") << info.params[i].first;
  os << "], \"param_sizes\": [";
  for (size_t i = 0; i < info.params.size(); ++i) os << (i ? ", " : "") << info.params[i].second;
  os << "], \"param_buffer_size\": " << args.size() << ", \"args\": \"" << hex(args.data(), args.size()) << "\"";
  os << ", \"attributes\": " << "[";
  for (size_t i = 0; i < l.attributes.size(); ++i) os << (i ? ", " : "") << l.attributes[i];
  os << "], \"allocations\": [";
  for (size_t i = 0; i < allocations.size(); ++i)
    os << (i ? ", " : "") << "{\"base\": " << allocations[i].base << ", \"size\": " << allocations[i].size
       << ", \"in_window\": " << (allocations[i].in_window ? "true" : "false")
       << ", \"managed\": " << (allocations[i].managed ? "true" : "false") << "}";
  os << "], \"windows\": [";
  auto windows = MemoryWindow::instance().windows();
  bool first = true;
  for (const auto& w : windows) {
    if (w.device != device) continue;
    os << (first ? "" : ", ") << "{\"device\": " << w.device << ", \"base\": " << w.base << ", \"size\": " << w.size
       << ", \"reserved\": " << (w.reserved ? "true" : "false") << "}";
    first = false;
  }
  os << "], \"snapshot_scope\": \"" << (reachable ? "reachable" : "all") << "\", \"pool_allocator\": " << json_string(pool)
     << ", " << uncaptured_json() << ", \"foreign_references\": [";
  for (size_t i = 0; i < p->foreign_refs.size(); ++i)
    os << (i ? ", " : "") << "{\"region\": " << p->foreign_refs[i].first << ", \"target\": " << p->foreign_refs[i].second
       << "}";
  os << "]";
  p->launch_json_head = os.str();
  // Hold the instance slot (and the identity) until the epilogue is committed
  // or dropped: finish_pending gives them back.
  p->f = l.f;
  p->token = ++g_launch_token;
  if (!settings().record_duplicates) p->identity_reserved = ks.seen.insert(identity).second;
  ks.pending++;
  g_in_flight++;
  t_pending = std::move(p);
}

// Under g_mu: the pending launch `p` is committed or dropped; its slot and the
// in-flight count are given back, and the callbacks may go off now.
void finish_pending(Pending& p, bool committed) {
  KernelState& ks = *p.kernel;
  ks.pending--;
  g_in_flight--;
  if (committed) {
    ks.recorded++;
    ks.seen.insert(p.identity);
    g_recorded++;
    if (settings().max_instances > 0 && ks.recorded >= settings().max_instances) ks.finished = true;
  } else if (p.identity_reserved) {
    ks.seen.erase(p.identity);
  }
  update_launch_callbacks();
}

// A pending launch that cannot be matched to its exit callback: its entry is
// removed, not committed (its epilogue would be taken after another launch).
void drop_pending(std::unique_ptr<Pending> p, const char* why) {
  Lock lock(g_mu);
  std::fprintf(stderr, "mneme record: warning: %s: a recorded launch is dropped: %s\n", p->kernel->name.c_str(), why);
  remove_tree(p->tmp_dir);
  finish_pending(*p, false);
}

// Under g_mu, at API exit of the launch: wait for it, capture the epilogue,
// commit. False: the entry is removed (the reason is reported).
bool commit_launch(Pending* p, CUresult launch_result) {
  if (launch_result != CUDA_SUCCESS) {
    remove_tree(p->tmp_dir);
    return false;  // the application sees the launch error itself
  }
  CUresult r = driver().cuCtxSynchronize();
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "mneme record: warning: %s failed while recording (%s); this launch is not recorded\n",
                 p->kernel->name.c_str(), error_string(r));
    remove_tree(p->tmp_dir);
    return false;
  }
  auto t0 = std::chrono::steady_clock::now();
  uint64_t epilogue_bytes = 0;
  std::string error;
  std::vector<std::vector<Piece>> prologue_pieces;
  for (const auto& r : p->regions) prologue_pieces.push_back(r.pieces);
  bool written;
  {
    WritingSnapshot writing;
    written = writer_for_current_context().write(p->tmp_dir + "/epilogue", p->regions, {}, 0, &epilogue_bytes, &error,
                                                 &p->new_digests);
  }
  if (!written) {
    remove_tree(p->tmp_dir);
    stop_recording(error);
    return false;
  }
  double epilogue_seconds = seconds_since(t0);
  double epilogue_write = writer_for_current_context().last_write_seconds();
  const uint64_t epilogue_copied = writer_for_current_context().last_copied_bytes();
  const double epilogue_digest = writer_for_current_context().last_digest_seconds();
  if (writer_for_current_context().last_stripes() != p->stripes) {  // cannot happen, as below
    remove_tree(p->tmp_dir);
    stop_recording("internal error: prologue and epilogue stripe counts differ");
    return false;
  }
  for (size_t i = 0; i < p->regions.size(); ++i) {
    const auto& a = prologue_pieces[i];
    const auto& b = p->regions[i].pieces;
    bool same = a.size() == b.size();
    for (size_t k = 0; same && k < a.size(); ++k)
      same = a[k].stripe == b[k].stripe && a[k].offset == b[k].offset && a[k].size == b[k].size;
    if (!same) {  // cannot happen: the layout depends on the region list only
      remove_tree(p->tmp_dir);
      stop_recording("internal error: prologue and epilogue layouts differ");
      return false;
    }
  }
  std::ostringstream os;
  os << p->launch_json_head << ", \"regions\": " << regions_json(p->regions, prologue_pieces)
     << ", \"prologue_bytes\": " << p->prologue_bytes << ", \"epilogue_bytes\": " << epilogue_bytes
     << ", \"prologue_seconds\": " << p->prologue_seconds << ", \"epilogue_seconds\": " << epilogue_seconds
     << ", \"prologue_wait_seconds\": {\"file_writes\": " << p->prologue_writer_wait
     << ", \"copies\": " << p->prologue_copy_wait << ", \"setup\": " << p->prologue_setup << "}"
     << ", \"prologue_write_seconds\": " << p->prologue_write << ", \"epilogue_write_seconds\": " << epilogue_write
     << ", \"spool_wait_seconds\": " << p->spool_wait << ", \"prologue_copied_bytes\": " << p->prologue_copied
     << ", \"epilogue_copied_bytes\": " << epilogue_copied << ", \"prologue_digest_seconds\": " << p->prologue_digest
     << ", \"epilogue_digest_seconds\": " << epilogue_digest
     << ", \"warnings\": " << strings_json(p->warnings) << "}\n";
  std::string body = os.str();
  if (!write_file_atomic(p->tmp_dir + "/launch.json", body.data(), body.size(), &error)) {
    remove_tree(p->tmp_dir);
    stop_recording(error);
    return false;
  }
  if (rename(p->tmp_dir.c_str(), p->final_dir.c_str()) != 0) {
    remove_tree(p->tmp_dir);
    stop_recording("cannot commit " + p->final_dir + ": " + std::strerror(errno));
    return false;
  }
  for (const auto& w : p->warnings)
    std::fprintf(stderr, "mneme record: warning: %s: %s\n", p->kernel->name.c_str(), w.c_str());
  g_committed.emplace_back(p->final_dir, p->prologue_copied + epilogue_copied);
  writer_for_current_context().remember(p->new_digests);
  return true;
}

void after_launch(std::unique_ptr<Pending> p, CUresult launch_result) {
  Lock lock(g_mu);
  finish_pending(*p, commit_launch(p.get(), launch_result));
}

void on_module_loaded(const CUpti_ResourceData* rd) {
  auto* md = static_cast<const CUpti_ModuleResourceData*>(rd->resourceDescriptor);
  t_module_loaded = true;
  if (!md || g_disabled) return;
  Lock lock(g_mu);
  // Eager loading: the load call in progress. Lazy: the launch that loads it.
  const void* image = t_loading_image ? t_loading_image : t_launch_image;
  if (!md->pCubin || !md->cubinSize) {  // kernels unknown: launches must be watched
    if (settings().verbose) std::fprintf(stderr, "mneme record: module %u loaded without its image\n", md->moduleId);
    g_unknown_module = true;
    return update_launch_callbacks();
  }
  CubinSymbols syms = read_cubin_symbols(md->pCubin, md->cubinSize);
  ModuleInfo info;
  info.id = md->moduleId;
  info.kernels.insert(syms.kernels.begin(), syms.kernels.end());
  info.globals = syms.globals;
  g_modules.push_back(std::move(info));
  // Only a module that defines a selected kernel can be named by an entry:
  // the others are not written (large applications load hundreds of them).
  bool wanted = !syms.readable;
  for (const auto& k : syms.kernels) {
    if (name_selected(k)) {
      g_candidates.insert(k);
      wanted = true;
    }
  }
  if (!syms.readable) g_unknown_module = true;
  if (settings().verbose)
    std::fprintf(stderr, "mneme record: module %u loaded: %zu kernels%s%s\n", md->moduleId, syms.kernels.size(),
                 syms.readable ? "" : " (symbols unreadable)", wanted ? ", kept" : "");
  update_launch_callbacks();
  if (!wanted || !g_modules_written.insert(md->moduleId).second) return;
  std::string base = spool("modules/" + std::to_string(md->moduleId));
  std::string error;
  if (!make_dirs(spool("modules"))) return stop_recording("cannot create " + spool("modules"));
  if (!write_file_atomic(base + ".cubin", md->pCubin, md->cubinSize, &error)) return stop_recording(error);
  const char* source_kind = "";
  const void* source = nullptr;
  size_t source_size = image ? image_size(image, &source_kind, &source) : 0;
  if (source_size && !write_file_atomic(base + ".src", source, source_size, &error)) return stop_recording(error);
  std::ostringstream os;
  os << "{\"module_id\": " << md->moduleId << ", \"cubin_size\": " << md->cubinSize
     << ", \"source_kind\": " << json_string(source_size ? source_kind : "") << ", \"source_size\": " << source_size
     << ", \"kernels\": " << strings_json(syms.kernels) << ", \"globals\": " << strings_json(syms.globals) << "}\n";
  std::string body = os.str();
  if (!write_file_atomic(base + ".json", body.data(), body.size(), &error)) stop_recording(error);
}

// The bytes of a CUlaunchAttributeValue that attribute `id` defines: the
// application sets one member of the 64-byte union and the rest is whatever
// was on its stack, which must not reach the launch identity (the recorder's
// duplicate check, the agent's dynamic hash). Unknown ids: the whole union.
using AttrValue = CUlaunchAttributeValue;
struct AttrField {
  size_t offset, size;
};
#define MNEME_FIELD(m) AttrField{offsetof(AttrValue, m), sizeof(std::declval<AttrValue&>().m)}
#define MNEME_SUBFIELD(m, f) \
  AttrField{offsetof(AttrValue, m) + offsetof(decltype(AttrValue::m), f), sizeof(std::declval<AttrValue&>().m.f)}

std::vector<AttrField> attribute_fields(CUlaunchAttributeID id) {
  switch (id) {
    case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
      return {MNEME_SUBFIELD(accessPolicyWindow, base_ptr), MNEME_SUBFIELD(accessPolicyWindow, num_bytes),
              MNEME_SUBFIELD(accessPolicyWindow, hitRatio), MNEME_SUBFIELD(accessPolicyWindow, hitProp),
              MNEME_SUBFIELD(accessPolicyWindow, missProp)};
    case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
      return {MNEME_FIELD(cooperative)};
    case CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY:
      return {MNEME_FIELD(syncPolicy)};
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
      return {MNEME_SUBFIELD(clusterDim, x), MNEME_SUBFIELD(clusterDim, y), MNEME_SUBFIELD(clusterDim, z)};
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      return {MNEME_FIELD(clusterSchedulingPolicyPreference)};
    case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
      return {MNEME_FIELD(programmaticStreamSerializationAllowed)};
    case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT:
      return {MNEME_SUBFIELD(programmaticEvent, event), MNEME_SUBFIELD(programmaticEvent, flags),
              MNEME_SUBFIELD(programmaticEvent, triggerAtBlockStart)};
    case CU_LAUNCH_ATTRIBUTE_PRIORITY:
      return {MNEME_FIELD(priority)};
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
      return {MNEME_SUBFIELD(memSyncDomainMap, default_), MNEME_SUBFIELD(memSyncDomainMap, remote)};
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
      return {MNEME_FIELD(memSyncDomain)};
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION:
      return {MNEME_SUBFIELD(preferredClusterDim, x), MNEME_SUBFIELD(preferredClusterDim, y),
              MNEME_SUBFIELD(preferredClusterDim, z)};
    case CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT:
      return {MNEME_SUBFIELD(launchCompletionEvent, event), MNEME_SUBFIELD(launchCompletionEvent, flags)};
#if CUDA_VERSION >= 12080
    case CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE:  // int, then a pointer: 4 padding bytes between
      return {MNEME_SUBFIELD(deviceUpdatableKernelNode, deviceUpdatable),
              MNEME_SUBFIELD(deviceUpdatableKernelNode, devNode)};
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      return {MNEME_FIELD(sharedMemCarveout)};
#endif
#if CUDA_VERSION >= 13000
    case CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING:
      return {MNEME_FIELD(nvlinkUtilCentricScheduling)};
#endif
    default:
      return {AttrField{0, sizeof(AttrValue)}};
  }
}
#undef MNEME_FIELD
#undef MNEME_SUBFIELD

}  // namespace

// A launch attribute as launch.json lists it; empty for one the driver ignores.
// cooperative and cluster_dim are decoded (cuLaunchCooperativeKernel records
// cooperative the same way); the others keep the bytes of their members
// (value_hex: padding between members zeroed, the union's tail left out; the
// replay pads to the union's size).
std::string attribute_json(const CUlaunchAttribute& at) {
  const std::string id = "{\"id\": " + std::to_string(unsigned(at.id)) + ", ";
  switch (at.id) {
    case CU_LAUNCH_ATTRIBUTE_IGNORE:
      return "";
    case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
      return id + "\"name\": \"cooperative\", \"value\": [" + std::to_string(unsigned(at.value.cooperative)) + "]}";
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
      return id + "\"name\": \"cluster_dim\", \"value\": [" + std::to_string(at.value.clusterDim.x) + ", " +
             std::to_string(at.value.clusterDim.y) + ", " + std::to_string(at.value.clusterDim.z) + "]}";
    default:
      break;
  }
  unsigned char bytes[sizeof(AttrValue)] = {};
  size_t end = 0;
  for (const AttrField& f : attribute_fields(at.id)) {
    std::memcpy(bytes + f.offset, reinterpret_cast<const unsigned char*>(&at.value) + f.offset, f.size);
    end = std::max(end, f.offset + f.size);
  }
  return id + "\"name\": \"raw\", \"value_hex\": \"" + hex(bytes, end) + "\"}";
}

namespace {

Launch launch_of(CUpti_CallbackId cbid, const CUpti_CallbackData* cb) {
  Launch l;
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz: {
      // cuLaunchCooperativeKernel's parameters are cuLaunchKernel's minus `extra`.
      auto* a = static_cast<const cuLaunchKernel_params*>(cb->functionParams);
      bool coop = cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel ||
                  cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz;
      l.api = coop ? "cuLaunchCooperativeKernel" : "cuLaunchKernel";
      l.f = a->f;
      l.grid[0] = a->gridDimX, l.grid[1] = a->gridDimY, l.grid[2] = a->gridDimZ;
      l.block[0] = a->blockDimX, l.block[1] = a->blockDimY, l.block[2] = a->blockDimZ;
      l.shared_mem = a->sharedMemBytes;
      l.stream = a->hStream;
      l.kernel_params = a->kernelParams;
      l.extra = coop ? nullptr : a->extra;
      if (coop) {  // as cuLaunchKernelEx with the cooperative attribute 1 records it
        CUlaunchAttribute at{};
        at.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        at.value.cooperative = 1;
        l.attributes.push_back(attribute_json(at));
      }
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz: {
      auto* a = static_cast<const cuLaunchKernelEx_params*>(cb->functionParams);
      l.api = "cuLaunchKernelEx";
      l.f = a->f;
      const CUlaunchConfig* c = a->config;
      l.grid[0] = c->gridDimX, l.grid[1] = c->gridDimY, l.grid[2] = c->gridDimZ;
      l.block[0] = c->blockDimX, l.block[1] = c->blockDimY, l.block[2] = c->blockDimZ;
      l.shared_mem = c->sharedMemBytes;
      l.stream = c->hStream;
      l.kernel_params = a->kernelParams;
      l.extra = a->extra;
      for (unsigned i = 0; i < c->numAttrs; ++i) {
        std::string json = attribute_json(c->attrs[i]);
        if (!json.empty()) l.attributes.push_back(json);
      }
      break;
    }
    default:
      break;
  }
  return l;
}

// The kernel of a launch callback (its exit's parameters are its enter's).
CUfunction launched_function(CUpti_CallbackId cbid, const CUpti_CallbackData* cb) {
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz:
      return static_cast<const cuLaunchKernel_params*>(cb->functionParams)->f;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
      return static_cast<const cuLaunchKernelEx_params*>(cb->functionParams)->f;
    default:
      return nullptr;
  }
}

// Keeps uncaptured.hpp's registry current from a successful call's parameters.
void note_uncaptured(CUpti_CallbackId cbid, const void* params) {
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuTexObjectCreate:
      note_object(ObjectKind::texture, *static_cast<const cuTexObjectCreate_params*>(params)->pTexObject, true);
      break;
    case CUPTI_DRIVER_TRACE_CBID_cuTexObjectDestroy:
      note_object(ObjectKind::texture, static_cast<const cuTexObjectDestroy_params*>(params)->texObject, false);
      break;
    case CUPTI_DRIVER_TRACE_CBID_cuSurfObjectCreate:
      note_object(ObjectKind::surface, *static_cast<const cuSurfObjectCreate_params*>(params)->pSurfObject, true);
      break;
    case CUPTI_DRIVER_TRACE_CBID_cuSurfObjectDestroy:
      note_object(ObjectKind::surface, static_cast<const cuSurfObjectDestroy_params*>(params)->surfObject, false);
      break;
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged: {
      auto* p = static_cast<const cuMemAllocManaged_params*>(params);
      MemoryWindow::instance().track_managed(*p->dptr, p->bytesize);
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc: {  // with unified addressing the host pointer is the device's
      auto* p = static_cast<const cuMemHostAlloc_params*>(params);
      note_foreign_range("host", reinterpret_cast<uint64_t>(*p->pp), p->bytesize);
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2: {
      auto* p = static_cast<const cuMemAllocHost_v2_params*>(params);
      note_foreign_range("host", reinterpret_cast<uint64_t>(*p->pp), p->bytesize);
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemHostRegister_v2: {
      auto* p = static_cast<const cuMemHostRegister_v2_params*>(params);
      note_foreign_range("host", reinterpret_cast<uint64_t>(p->p), p->bytesize);
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuIpcOpenMemHandle_v2: {
      CUdeviceptr base = *static_cast<const cuIpcOpenMemHandle_v2_params*>(params)->pdptr, range_base = 0;
      size_t size = 0;
      if (driver().cuMemGetAddressRange_v2(&range_base, &size, base) != CUDA_SUCCESS) size = 1;
      note_foreign_range("ipc", base, size);
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost:
      forget_foreign_range(reinterpret_cast<uint64_t>(static_cast<const cuMemFreeHost_params*>(params)->p));
      break;
    case CUPTI_DRIVER_TRACE_CBID_cuMemHostUnregister:
      forget_foreign_range(reinterpret_cast<uint64_t>(static_cast<const cuMemHostUnregister_params*>(params)->p));
      break;
    case CUPTI_DRIVER_TRACE_CBID_cuIpcCloseMemHandle:
      forget_foreign_range(static_cast<const cuIpcCloseMemHandle_params*>(params)->dptr);
      break;
    case CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2:  // frees managed memory too
      MemoryWindow::instance().forget_managed(static_cast<const cuMemFree_v2_params*>(params)->dptr);
      break;
    default:
      break;
  }
}

thread_local bool t_inside = false;  // our own driver calls re-enter the callback

}  // namespace

Prospect recording_prospect(const Launch& l) {
  if (g_disabled) return Prospect::never;
  Lock lock(g_mu);
  FunctionInfo& info = function_info(l.f, nullptr);
  const KernelState& ks = *info.kernel;
  CUdevice device = 0;
  if (!ks.selected || ks.finished || !device_selected(&device)) return Prospect::never;
  if (settings().record_duplicates) return Prospect::maybe;
  std::vector<unsigned char> args;
  if (resolve_layout(l.f, info) != CUDA_SUCCESS || !info.layout_known || !param_bytes(l, info, &args))
    return Prospect::maybe;
  return ks.seen.count(launch_identity(l, args)) ? Prospect::seen : Prospect::maybe;
}

std::string kernel_name(CUfunction f) {
  Lock lock(g_mu);
  return function_info(f, nullptr).kernel->name;
}

void CUPTIAPI on_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* cbdata) {
  if (domain == CUPTI_CB_DOMAIN_RESOURCE) {
    // Also inside the recorder's own driver calls (loading the recorded kernel), but for its digest kernel's.
    if (t_inside && t_writing_snapshot) return;
    const bool was_inside = t_inside;
    t_inside = true;
    if (cbid == CUPTI_CBID_RESOURCE_MODULE_LOADED) on_module_loaded(static_cast<const CUpti_ResourceData*>(cbdata));
    t_inside = was_inside;
    return;
  }
  if (t_inside) return;
  t_inside = true;
  auto* cb = static_cast<const CUpti_CallbackData*>(cbdata);
  bool enter = cb->callbackSite == CUPTI_API_ENTER;
  if (on_graph_callback(cbid, cb)) {  // graph instantiation, changes, launches (graph_expansion.cpp)
    t_inside = false;
    return;
  }
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuModuleLoadData:
    case CUPTI_DRIVER_TRACE_CBID_cuModuleLoadDataEx:
    case CUPTI_DRIVER_TRACE_CBID_cuModuleLoadFatBinary: {
      // Both param structs start with (CUmodule*, const void* image).
      auto* a = static_cast<const cuModuleLoadData_params*>(cb->functionParams);
      t_loading_image = enter ? a->image : nullptr;
      if (enter) {
        t_module_loaded = false;
      } else if (!t_module_loaded && a->module && *static_cast<const CUresult*>(cb->functionReturnValue) == CUDA_SUCCESS) {
        remember_module_image(*a->module, a->image);  // lazy: it loads at its first launch
      }
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLibraryLoadData: {
      auto* a = static_cast<const cuLibraryLoadData_params*>(cb->functionParams);
      t_loading_image = enter ? a->code : nullptr;
      if (!enter && a->library && *static_cast<const CUresult*>(cb->functionReturnValue) == CUDA_SUCCESS)
        remember_library_image(*a->library, a->code);
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuTexObjectCreate:
    case CUPTI_DRIVER_TRACE_CBID_cuTexObjectDestroy:
    case CUPTI_DRIVER_TRACE_CBID_cuSurfObjectCreate:
    case CUPTI_DRIVER_TRACE_CBID_cuSurfObjectDestroy:
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged:
    case CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc:
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemHostRegister_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuIpcOpenMemHandle_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost:
    case CUPTI_DRIVER_TRACE_CBID_cuMemHostUnregister:
    case CUPTI_DRIVER_TRACE_CBID_cuIpcCloseMemHandle:
    case CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2:
      if (!enter && *static_cast<const CUresult*>(cb->functionReturnValue) == CUDA_SUCCESS)
        note_uncaptured(cbid, cb->functionParams);
      break;
    default: {
      // A launch's enter and exit come on its thread with nothing between, so
      // a pending launch at an enter, or one whose exit names another launch,
      // lost its exit callback: it is dropped, never committed after another launch.
      if (enter) {
        if (t_pending) drop_pending(std::move(t_pending), "its launch's exit callback never came");
        t_launch_image = nullptr;  // before_launch sets it where the module may load inside this launch
        CUfunction f = launched_function(cbid, cb);
        if (f && launch_needs_look(f)) before_launch(launch_of(cbid, cb), cb->symbolName);
        if (t_pending) {
          t_pending->cbid = cbid;
          if (cb->correlationData) *cb->correlationData = t_pending->token;
        }
      } else if (t_launch_image = nullptr; t_pending) {
        std::unique_ptr<Pending> p = std::move(t_pending);
        if (p->cbid == cbid && p->f == launched_function(cbid, cb) &&
            (!cb->correlationData || *cb->correlationData == p->token))
          after_launch(std::move(p), *static_cast<const CUresult*>(cb->functionReturnValue));
        else
          drop_pending(std::move(p), "an exit callback of another launch came before its own");
      }
    }
  }
  t_inside = false;
}

void set_launch_callback_switch(void (*enable)(bool)) {
  Lock lock(g_mu);
  g_launch_switch = enable;
  update_launch_callbacks();  // lazy loading: on from the start (every launch is watched)
}

void write_recorder_info(const char* cupti_path) {
  const Settings& s = settings();
  make_dirs(spool("entries"));
  make_dirs(spool("modules"));
  std::ostringstream os;
  os << "{\"format\": \"mneme-spool/1\", \"pid\": " << getpid() << ", \"rank\": " << json_string(s.rank)
     << ", \"va_base\": " << s.va_base << ", \"va_size\": " << s.va_size << ", \"cupti\": " << json_string(cupti_path)
     << "}\n";
  std::string body = os.str(), error;
  if (!write_file_atomic(spool("recorder.json"), body.data(), body.size(), &error)) stop_recording(error);
}

void write_done_marker() {
  std::ostringstream os;
  os << "{\"launches_seen\": " << g_launches_seen.load() << ", \"recorded\": " << g_recorded.load()
     << ", \"graph_launches\": " << graph_launches() << ", \"graph_launches_expanded\": " << graph_launches_expanded()
     << ", \"error\": " << json_string(g_error) << "}\n";
  std::string body = os.str(), error;
  write_file_atomic(spool("done.json"), body.data(), body.size(), &error);
}

}  // namespace mneme::rec
