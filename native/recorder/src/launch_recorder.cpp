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
#include "mneme/common/interpose.hpp"
#include "mneme/common/settings.hpp"
#include "mneme/common/text.hpp"

#include "annotations.hpp"
#include "code_images.hpp"
#include "deadlines.hpp"
#include "graph_expansion.hpp"
#include "memory_window.hpp"
#include "name_filter.hpp"
#include "pool_allocators.hpp"
#include "spool.hpp"
#include "texture_objects.hpp"
#include "uncaptured.hpp"

using namespace mneme::common;

namespace mneme::rec {
namespace {

// Threads (docs/recording.md, "Threads and deadlines"). The application's
// threads run the callbacks below concurrently. Rules that keep them from
// blocking one another, or the driver, indefinitely:
//
// * g_mu guards the recorder's tables and is a leaf: code holding it calls
//   no driver function and waits for nothing else (the module-loaded callback
//   takes it from inside the driver, possibly while the driver holds its own
//   module-loading lock, so a holder that called into the driver could
//   deadlock with it). It is taken with a deadline all the same.
// * One launch is recorded at a time: its thread owns the recording gate
//   (deadlines.hpp) from before the prologue to after the epilogue; other
//   threads' launches wait at the gate, so only the recorded kernel changes
//   device memory between the snapshots. Every wait at the gate has a deadline.
// * The blocking driver work of a recording (synchronizing the context, the
//   managed prefetch, digests, copies, file writes) runs on the context's
//   worker thread; the recording thread waits for it until a deadline, then
//   abandons the instance and lets its launch go on.
// * Entries are numbered when they are committed (g_commit_mu), in the order
//   their snapshots' digests are remembered, so that a piece left out of an
//   entry (its digest captured before) always names an entry with a smaller
//   number, which the agent has converted first.

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
  long recorded = 0;                   // committed or abandoned instances
  std::atomic<bool> capture_noted{false};  // stderr said once that its captured launches are recorded later
  bool no_module_noted = false;            // stderr said once that no module defining it was seen
  // Launches whose recording is under way (reserved before the prologue, until
  // committed, abandoned or dropped): they hold instance slots (recorded +
  // pending <= -mr), so two threads launching the kernel at once cannot both
  // take its last slot.
  long pending = 0;
  std::unordered_set<uint64_t> seen;  // launch-identity hashes recorded or pending
};

struct FunctionInfo {
  KernelState* kernel = nullptr;
  bool layout_known = false;
  std::vector<std::pair<size_t, size_t>> params;  // offset, size
  size_t param_buffer_size = 0;
};

// Per context: the snapshot writer and the worker that runs its blocking work.
struct ContextRecorder {
  SnapshotWriter writer;
  Worker worker;
  // Device buffers the CUDA arrays of the recording under way are copied into (texture_objects.hpp):
  // allocated by its prologue job, freed by its epilogue job, or by the next prologue when the
  // instance was abandoned in between. Touched on the worker's thread only.
  std::vector<CUdeviceptr> staging;
  explicit ContextRecorder(std::function<void()> on_start) : worker(std::move(on_start)) {}
};

// The spool directory of an entry's snapshots. Once the entry is abandoned,
// whoever comes last removes it: the recording thread at once, a snapshot job
// still running on the worker when it ends.
struct EntryDir {
  std::string path;
  std::mutex mu;
  bool abandoned = false;
  void abandon() {
    {
      std::lock_guard<std::mutex> lock(mu);
      abandoned = true;
    }
    remove_tree(path);
  }
  bool is_abandoned() {
    std::lock_guard<std::mutex> lock(mu);
    return abandoned;
  }
};

// What one snapshot job owns. The job may outlive its launch's wait (the
// instance is then abandoned), so it shares nothing with the recording thread
// but this object.
struct PhaseJob {
  CUcontext ctx = nullptr;
  ContextRecorder* recorder = nullptr;  // never destroyed
  std::shared_ptr<EntryDir> dir;
  std::string phase;  // "prologue" | "epilogue"
  std::vector<DeviceRegion> regions;
  std::set<uint64_t> bases;           // of `regions` (reachable-scope discovery adds to both)
  std::vector<uint64_t> managed;      // bases of managed allocations: prefetched to the device first
  std::vector<ArrayCapture> arrays;   // CUDA arrays to copy, each into its region (kind "array") of `regions`
  std::vector<size_t> array_regions;  // the index in `regions` of each of `arrays`
  CUdevice device = 0;
  bool reachable = false, foreign = false;
  uint64_t byte_cap = 0;
  DigestSet digests;  // in: the prologue's copies (epilogue); out: plus this phase's
  std::vector<std::pair<uint64_t, uint64_t>> foreign_refs;  // (region base, value): pointers into uncaptured memory
  // Results.
  bool ok = false, io_failure = false;
  std::string error;
  uint64_t bytes = 0, copied = 0;
  int stripes = 0;
  double seconds = 0, writer_wait = 0, copy_wait = 0, setup = 0, write = 0, digest = 0;
};

// A launch whose recording is under way, from its reservation (before the
// gate) to its commit, abandonment or drop.
struct Pending {
  // Which launch this is: its exit callback must name the same (the stale
  // pending of a launch whose exit never came is dropped, never committed).
  CUpti_CallbackId cbid = 0;
  CUfunction f = nullptr;
  uint64_t token = 0;  // also in the launch's CUPTI correlationData
  bool identity_reserved = false;  // `identity` went into kernel->seen at the reservation
  KernelState* kernel = nullptr;
  long index = 0;
  uint64_t identity = 0;
  CUdevice device = 0;
  ContextRecorder* recorder = nullptr;
  CUcontext ctx = nullptr;
  std::shared_ptr<EntryDir> dir;
  std::string launch_part;  // launch.json: the kernel, its launch and its arguments
  std::string memory_part;  // launch.json: allocations, windows, scope, uncaptured memory
  std::shared_ptr<PhaseJob> prologue;
  double spool_wait = 0;  // back-pressure: waited for the agent to convert earlier entries
  std::vector<std::string> warnings;
};

// Serializes the tables below; a leaf (see above), taken with a deadline.
// Recursive: the module-loaded callback may come on a thread that holds it
// (a driver call under it would break the rule, but must not self-deadlock).
std::recursive_timed_mutex g_mu;
std::deque<ModuleInfo> g_modules;  // a deque: a module loading mid-recording moves no entry
std::set<uint32_t> g_modules_written;
std::unordered_map<std::string, std::unique_ptr<KernelState>> g_kernels;
std::unordered_map<CUfunction, FunctionInfo> g_functions;  // node-based: references stay valid
// Never destroyed: a worker may still run a job of its context while the process exits.
auto& g_contexts = *new std::map<CUcontext, std::unique_ptr<ContextRecorder>>();
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
std::atomic<long> g_launches_seen{0}, g_recorded{0}, g_abandoned{0};
std::string g_error;

// Commits: entry numbers, the committed entries' bytes (back-pressure).
std::mutex g_commit_mu;
long g_seq = 0;
std::vector<std::pair<std::string, uint64_t>> g_committed;  // entry dir, bytes

thread_local const void* t_loading_image = nullptr;
thread_local bool t_module_loaded = false;    // a module-loaded callback came during the current load call
// The image of the kernel this thread is launching (looked up at a kernel's
// first launch on the thread, when lazy loading may load its module inside the
// launch: the module-loaded callback makes no driver call of its own).
thread_local const void* t_launch_image = nullptr;
// While the recorder takes a snapshot: a module loading then is its own (the
// digest kernel's), not the application's. Module loads inside its other
// driver calls (loading the recorded kernel, asking for its name or module)
// are the application's. Always true on the workers' threads.
thread_local bool t_writing_snapshot = false;
thread_local bool t_inside = false;  // our own driver calls re-enter the callback
// Threads that launched with the launch callbacks on (they stay on once there are several).
std::atomic<int> g_launch_threads{0};
thread_local bool t_launched = false;
thread_local bool t_callbacks_went_off = false;  // this thread switched them off in its current callback
thread_local std::unique_ptr<Pending> t_pending;

// The recorder's tables, locked with a deadline (false: not locked; the
// caller goes on without the tables, which only happens if a holder broke
// the leaf rule).
struct TablesLock {
  std::unique_lock<std::recursive_timed_mutex> lock;
  TablesLock() : lock(g_mu, std::defer_lock) {
    if (lock.try_lock_for(std::chrono::duration_cast<std::chrono::microseconds>(
            std::chrono::duration<double>(deadline_seconds()))))
      return;
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      std::fprintf(stderr, "mneme record: warning: the recorder's lock was busy for %.1f s (its deadline); the"
                   " recorder skips what needed it and the application goes on\n", deadline_seconds());
  }
  explicit operator bool() const { return lock.owns_lock(); }
};

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

// Under g_mu.
bool name_selected(const std::string& name) {
  auto it = g_name_selected.find(name);
  if (it == g_name_selected.end()) it = g_name_selected.emplace(name, name_matches(name)).first;
  return it->second;
}

// Under g_mu: whether launch callbacks should be on. Under lazy module
// loading a module loads at the first launch of one of its kernels, after that
// launch's enter callback, so its kernels are unknown until then: every launch
// is watched (a kernel the filter rejected costs one thread-local lookup).
bool launch_callbacks_wanted() {
  bool want = !settings().eager_loading || g_unknown_module || g_in_flight > 0;
  for (auto it = g_candidates.begin(); !want && it != g_candidates.end(); ++it) {
    auto k = g_kernels.find(*it);
    want = k == g_kernels.end() || !k->second->finished;
  }
  return want;
}

// Not under g_mu (CUPTI is called outside the recorder's lock): switches the
// launch callbacks to what launch_callbacks_wanted() says. Off (eager loading
// only) only while one application thread launches and no launch is between
// its enter and exit callbacks (gate::quiesce), so that no launch loses its
// exit callback and stays counted at the gate; when that cannot be had now, a
// later call switches.
void apply_launch_callbacks() {
  static auto* switch_mu = new std::timed_mutex;
  std::unique_lock<std::timed_mutex> switching(*switch_mu, std::defer_lock);
  if (!switching.try_lock_for(std::chrono::duration_cast<std::chrono::microseconds>(
          std::chrono::duration<double>(deadline_seconds()))))
    return;
  bool want;
  {
    TablesLock lock;
    if (!lock) return;
    want = launch_callbacks_wanted();
    if (want == g_launch_callbacks_on || !g_launch_switch) return;
  }
  if (want) {
    g_launch_switch(true);
  } else if (g_launch_threads.load() > 1) {
    // Several threads launch: a launch of another thread could be inside its
    // enter callback now, count itself inside the driver at its end and lose
    // its exit callback; the recording gate would then wait for it in vain.
    return;
  } else if (!gate::quiesce(deadline_after(deadline_seconds()), [] {
               g_launch_switch(false);
               t_callbacks_went_off = true;
               gate::leave(gate::launch_callback);  // this thread's own exit callback may not come now
             })) {
    return;
  }
  {
    TablesLock lock;
    if (lock) g_launch_callbacks_on = want;
  }
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

// The kernel's name as the driver tells it (not under g_mu).
std::string query_kernel_name(CUfunction f, const char* symbol_name) {
  std::string name = symbol_name ? symbol_name : "";
  const char* n = nullptr;
  if (name.empty() && driver().cuFuncGetName && driver().cuFuncGetName(&n, f) == CUDA_SUCCESS && n) name = n;
  if (name.empty() && driver().cuKernelGetName &&  // a CUkernel (cudart's handles)
      driver().cuKernelGetName(&n, reinterpret_cast<CUkernel>(f)) == CUDA_SUCCESS && n)
    name = n;
  return name;
}

// The table entry of a launched function (created at its first sight: the
// driver is asked for its name outside g_mu). False: the lock's deadline passed.
bool function_entry(CUfunction f, const char* symbol_name, FunctionInfo** out) {
  {
    TablesLock lock;
    if (!lock) return false;
    auto it = g_functions.find(f);
    if (it != g_functions.end()) {
      *out = &it->second;
      return true;
    }
  }
  std::string name = query_kernel_name(f, symbol_name);
  TablesLock lock;
  if (!lock) return false;
  auto it = g_functions.find(f);
  if (it == g_functions.end()) {
    auto& ks = g_kernels[name];
    if (!ks) {
      ks = std::make_unique<KernelState>();
      ks->name = name;
      ks->selected = !name.empty() && name_selected(name);  // a kernel without a name cannot be recorded
      if (name.empty()) std::fprintf(stderr, "mneme record: warning: a launched kernel has no name; it is not recorded\n");
    }
    FunctionInfo info;
    info.kernel = ks.get();
    it = g_functions.emplace(f, std::move(info)).first;
  }
  *out = &it->second;
  return true;
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

struct Layout {
  bool known = false;
  std::vector<std::pair<size_t, size_t>> params;  // offset, size
  size_t buffer_size = 0;
};

// The parameter layout of `f` (asked of the driver once, outside g_mu).
// Not known: the driver cannot tell yet (lazy loading), with the reason.
Layout function_layout(CUfunction f, FunctionInfo& info, CUresult* why) {
  Layout out;
  *why = CUDA_SUCCESS;
  {
    TablesLock lock;
    if (!lock) return out;
    if (info.layout_known) {
      out.known = true;
      out.params = info.params;
      out.buffer_size = info.param_buffer_size;
      return out;
    }
  }
  if (!driver().cuFuncGetParamInfo) {  // an old driver: no parameters can be read
    *why = CUDA_ERROR_NOT_SUPPORTED;
    return out;
  }
  for (size_t i = 0;; ++i) {
    size_t off = 0, size = 0;
    CUresult r = param_info(f, i, &off, &size);
    if (r == CUDA_ERROR_INVALID_VALUE) break;  // past the last parameter
    if (r != CUDA_SUCCESS) {                   // layout not available (lazy loading)
      *why = r;
      return Layout{};
    }
    out.params.emplace_back(off, size);
    out.buffer_size = std::max(out.buffer_size, off + size);
  }
  out.known = true;
  TablesLock lock;
  if (lock && !info.layout_known) {
    info.params = out.params;
    info.param_buffer_size = out.buffer_size;
    info.layout_known = true;
  }
  return out;
}

bool param_bytes(const Launch& l, const Layout& layout, std::vector<unsigned char>* out) {
  out->assign(layout.buffer_size, 0);
  if (l.kernel_params) {
    for (size_t i = 0; i < layout.params.size(); ++i)
      std::memcpy(out->data() + layout.params[i].first, l.kernel_params[i], layout.params[i].second);
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
  return layout.buffer_size == 0;
}

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Under g_mu.
const ModuleInfo* module_of(const std::string& kernel) {
  for (auto it = g_modules.rbegin(); it != g_modules.rend(); ++it)
    if (it->kernels.count(kernel)) return &*it;
  return nullptr;
}

// Back-pressure: the agent deletes entries it has converted. Waits while the
// committed, unconverted entries exceed the spool bound, at most until the
// deadline (the base plus the time the agent needs for the excess at a
// quarter of the snapshot rate). False (*why): the deadline passed.
bool wait_for_spool_room(double* waited, std::string* why) {
  const auto started = Clock::now();
  Clock::time_point until{};
  for (;;) {
    uint64_t total = 0;
    {
      std::lock_guard<std::mutex> lock(g_commit_mu);
      std::vector<std::pair<std::string, uint64_t>> still;
      for (auto& [dir, bytes] : g_committed) {
        struct stat st;
        if (stat(dir.c_str(), &st) == 0) {
          still.emplace_back(dir, bytes);
          total += bytes;
        }
      }
      g_committed.swap(still);
      if (total <= settings().spool_max_bytes || g_committed.empty()) break;
    }
    if (until == Clock::time_point{})
      until = deadline_after(deadline_seconds(4 * (total - settings().spool_max_bytes)));
    if (g_disabled || access(spool("stop").c_str(), F_OK) == 0 || Clock::now() >= until) {
      *waited = std::chrono::duration<double>(Clock::now() - started).count();
      char buf[160];
      std::snprintf(buf, sizeof buf, "the spool stayed full for %.1f s (the record agent converting earlier entries;"
                    " --spool-max-bytes)", *waited);
      *why = buf;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  *waited = std::chrono::duration<double>(Clock::now() - started).count();
  return true;
}

void add_region_once(std::vector<DeviceRegion>& regions, std::set<uint64_t>& bases, const Allocation& a) {
  if (a.size == 0 || !bases.insert(a.base).second) return;
  regions.push_back(DeviceRegion{a.base, a.size, "heap", "", {}, 0, ""});
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
    if (!r.array.empty()) out += ", \"array\": " + r.array;
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

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

std::string bytes_text(uint64_t n) {
  char buf[32];
  if (n >= 1000000000ull) std::snprintf(buf, sizeof buf, "%.1f GB", n / 1e9);
  else if (n >= 1000000ull) std::snprintf(buf, sizeof buf, "%.1f MB", n / 1e6);
  else std::snprintf(buf, sizeof buf, "%llu bytes", (unsigned long long)n);
  return buf;
}

// cuCtxSetCurrent, for the workers (not in the shared driver table).
CUresult set_current_context(CUcontext ctx) {
  using Fn = CUresult (*)(CUcontext);
  static Fn fn = driver().handle ? reinterpret_cast<Fn>(real_dlsym(driver().handle, "cuCtxSetCurrent")) : nullptr;
  return fn ? fn(ctx) : CUDA_ERROR_NOT_INITIALIZED;
}

// The current context's recorder (its writer and worker), created at its first recording.
ContextRecorder* context_recorder(CUcontext* ctx_out) {
  CUcontext ctx = nullptr;
  driver().cuCtxGetCurrent(&ctx);
  *ctx_out = ctx;
  TablesLock lock;
  if (!lock) return nullptr;
  auto& r = g_contexts[ctx];
  if (!r)  // the worker's own driver calls (digest kernel, copies) are the recorder's, never recorded
    r = std::make_unique<ContextRecorder>([] {
      t_inside = true;
      t_writing_snapshot = true;
    });
  return r.get();
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
  if (!ks.capture_noted.exchange(true))
    std::fprintf(stderr, "mneme record: %s: a launch captured into a CUDA graph is recorded when the graph is"
                 " launched, not at capture\n", ks.name.c_str());
  return true;
}

// Under g_mu: whether the kernel's -mr instances are taken (recorded or under way).
bool slots_taken(const KernelState& ks) {
  return settings().max_instances > 0 && ks.recorded + ks.pending >= settings().max_instances;
}

// ---- the end of a recording: committed, abandoned or dropped --------------

enum class Outcome { committed, abandoned, dropped };

void disable_after_abandoned(long n) {
  const long cap = deadline_settings().max_abandoned;
  if (cap <= 0 || n < cap || g_disabled.exchange(true)) return;
  std::fprintf(stderr, "mneme record: warning: %ld instances were abandoned (waits past their deadline); recording"
               " stops here and the application goes on unrecorded (--deadline raises the deadline)\n", n);
}

// The pending launch `p` is over: its slot and the in-flight count are given
// back (a committed or abandoned instance keeps its identity), and the
// callbacks may go off now. Not under g_mu; the gate is released before.
void finish_pending(Pending& p, Outcome outcome) {
  {
    TablesLock lock;
    if (lock) {
      KernelState& ks = *p.kernel;
      ks.pending--;
      g_in_flight--;
      if (outcome != Outcome::dropped) {
        ks.recorded++;
        ks.seen.insert(p.identity);
        g_recorded++;
        if (settings().max_instances > 0 && ks.recorded >= settings().max_instances) ks.finished = true;
      } else if (p.identity_reserved) {
        ks.seen.erase(p.identity);
      }
    }
  }
  if (outcome == Outcome::abandoned) disable_after_abandoned(++g_abandoned);
  apply_launch_callbacks();
}

// A recording that ends without an entry (the launch is not recorded): its
// snapshots are removed, the gate opens, its slot is given back.
void release_unrecorded(std::unique_ptr<Pending> p) {
  if (p->dir) remove_tree(p->dir->path);
  gate::release();
  finish_pending(*p, Outcome::dropped);
}

// Under g_commit_mu: renames a complete entry directory into place as the next
// entry. False (*error): not committed.
bool commit_dir(const std::string& tmp, const std::string& head_fields, const std::string& rest, long* seq,
                std::string* error) {
  char name[32];
  std::snprintf(name, sizeof name, "%08ld", g_seq);
  const std::string final_dir = spool(std::string("entries/") + name);
  std::ostringstream os;
  os << "{\"format\": \"mneme-spool-entry/4\", " << head_fields << ", \"seq\": " << g_seq << ", \"pid\": " << getpid()
     << ", \"rank\": " << json_string(settings().rank) << ", " << rest << "}\n";
  std::string body = os.str();
  if (!write_file_atomic(tmp + "/launch.json", body.data(), body.size(), error)) return false;
  if (rename(tmp.c_str(), final_dir.c_str()) != 0) {
    *error = "cannot commit " + final_dir + ": " + std::strerror(errno);
    return false;
  }
  *seq = g_seq++;
  return true;
}

// The memory part of launch.json as it stands now (an instance abandoned
// before its snapshot was planned).
std::string memory_json(CUdevice device, const std::vector<Allocation>& allocations, bool reachable,
                        const std::string& pool, const std::string& objects = "[]") {
  std::ostringstream os;
  os << "\"allocations\": [";
  for (size_t i = 0; i < allocations.size(); ++i)
    os << (i ? ", " : "") << "{\"base\": " << allocations[i].base << ", \"size\": " << allocations[i].size
       << ", \"in_window\": " << (allocations[i].in_window ? "true" : "false")
       << ", \"managed\": " << (allocations[i].managed ? "true" : "false") << "}";
  os << "], \"windows\": [";
  bool first = true;
  for (const auto& w : MemoryWindow::instance().windows()) {
    if (w.device != device) continue;
    os << (first ? "" : ", ") << "{\"device\": " << w.device << ", \"base\": " << w.base << ", \"size\": " << w.size
       << ", \"reserved\": " << (w.reserved ? "true" : "false") << "}";
    first = false;
  }
  os << "], \"snapshot_scope\": \"" << (reachable ? "reachable" : "all") << "\", \"pool_allocator\": " << json_string(pool)
     << ", " << uncaptured_json() << ", \"objects\": " << objects;
  return os.str();
}

// The deadline of a wait passed (or the gate was given up on): the instance is
// abandoned. Its snapshots are removed (a job still running removes them when
// it ends, and is never waited for again); an entry without snapshots says
// why, which the agent writes as an instance with `supported: false`. The gate
// opens and the application's launch goes on.
void abandon(std::unique_ptr<Pending> p, const std::string& why) {
  if (p->dir) p->dir->abandon();
  if (p->memory_part.empty())
    p->memory_part = memory_json(p->device, MemoryWindow::instance().live_allocations(p->device), false, "");
  std::string error;
  bool written = false;
  {
    std::lock_guard<std::mutex> lock(g_commit_mu);
    const std::string tmp = spool("entries/a" + std::to_string(p->token) + ".tmp");
    if (make_dirs(tmp)) {
      std::ostringstream rest;
      rest << p->launch_part << ", " << p->memory_part << ", \"foreign_references\": [], \"regions\": []"
           << ", \"prologue_bytes\": 0, \"epilogue_bytes\": 0, \"spool_wait_seconds\": " << p->spool_wait
           << ", \"abandoned\": " << json_string(why) << ", \"warnings\": " << strings_json(p->warnings);
      long seq = 0;
      written = commit_dir(tmp, "\"stripes\": 0", rest.str(), &seq, &error);
      if (!written) remove_tree(tmp);
    } else {
      error = "cannot create " + tmp + ": " + std::strerror(errno);
    }
  }
  std::fprintf(stderr, "mneme record: warning: %s launch %ld abandoned: %s; the application goes on (the instance is"
               " written with supported: false)\n", p->kernel->name.c_str(), p->index, why.c_str());
  if (!written) stop_recording(error);
  gate::release();
  finish_pending(*p, Outcome::abandoned);
}

// ---- running the blocking work on the context's worker ------------------------

enum class Waited { done, late, busy };

Waited run_on_worker(ContextRecorder& cr, std::function<void()> job, double seconds) {
  switch (cr.worker.run(std::move(job), deadline_after(seconds))) {
    case Worker::Result::done:
      return Waited::done;
    case Worker::Result::late:
      return Waited::late;
    default:
      return Waited::busy;
  }
}

// Waits for all work of the context (the recorded launch's and, before the
// prologue, everything queued before it), on the worker, until the deadline.
Waited synchronize_context(ContextRecorder& cr, CUcontext ctx, CUresult* result) {
  auto r = std::make_shared<CUresult>(CUDA_SUCCESS);
  Waited w = run_on_worker(cr, [ctx, r] {
    CUresult s = set_current_context(ctx);
    *r = s == CUDA_SUCCESS ? driver().cuCtxSynchronize() : s;
  }, deadline_seconds());
  if (w == Waited::done) *result = *r;
  return w;
}

// Managed pages may sit in host memory: the captured ones move to the device
// first, in one bulk migration on the snapshot stream (ahead of the digests
// and copies there), rather than a page fault at a time under the digest
// kernel (copies would fetch them either way). Best effort: without prefetch
// support the snapshot reads them where they are.
void prefetch_managed(const PhaseJob& job, CUstream stream) {
  auto& d = driver();
  if (job.managed.empty() || !d.cuMemPrefetchAsync_v2 || !stream) return;
  std::set<uint64_t> managed(job.managed.begin(), job.managed.end());
  CUmemLocation to{};
  to.type = CU_MEM_LOCATION_TYPE_DEVICE;
  to.id = int(job.device);
  for (const auto& r : job.regions)
    if (r.kind == "heap" && managed.count(r.base)) d.cuMemPrefetchAsync_v2(r.base, r.size, to, 0, stream);
}

// On the worker: the staging buffers of CUDA arrays are freed.
void free_staging(ContextRecorder& cr) {
  for (CUdeviceptr p : cr.staging) driver().cuMemFree_v2(p);
  cr.staging.clear();
}

// On the worker, before a phase's copies: each CUDA array copied into its staging buffer (allocated by
// the prologue) on the snapshot stream, ahead of the digests and copies there. False (job->error): not.
bool stage_arrays(PhaseJob& job, SnapshotWriter& w) {
  if (job.arrays.empty()) return true;
  std::string error;
  CUstream stream = w.copy_stream(&error);
  if (!stream) {
    job.error = error;
    return false;
  }
  if (job.phase == "prologue") {
    free_staging(*job.recorder);  // left by an instance abandoned after its prologue
    for (size_t i = 0; i < job.arrays.size(); ++i) {
      CUdeviceptr p = 0;
      CUresult r = driver().cuMemAlloc_v2(&p, job.arrays[i].bytes());
      if (r != CUDA_SUCCESS) {
        job.error = "cannot allocate " + bytes_text(job.arrays[i].bytes()) + " of device memory to copy a CUDA array"
                    " into: " + error_string(r);
        return false;
      }
      job.recorder->staging.push_back(p);
      job.regions[job.array_regions[i]].copy_from = p;
    }
  }
  for (size_t i = 0; i < job.arrays.size(); ++i) {
    CUresult r = copy_array_async(job.arrays[i], job.regions[job.array_regions[i]].copy_from, stream);
    if (r != CUDA_SUCCESS) {
      job.error = std::string("copying a CUDA array failed: ") + error_string(r);
      return false;
    }
  }
  return true;
}

// One snapshot phase, on the worker (`job` owns everything it touches).
void run_phase(const std::shared_ptr<PhaseJob>& job) {
  if (job->dir->is_abandoned()) return;
  const auto t0 = std::chrono::steady_clock::now();
  SnapshotWriter& w = job->recorder->writer;
  CUresult cr = set_current_context(job->ctx);
  if (cr != CUDA_SUCCESS) {
    job->error = std::string("cannot make the context current on the recorder's worker: ") + error_string(cr);
    return;
  }
  const DeadlineSettings& ds = deadline_settings();
  if (ds.stall_ms > 0 && (ds.stall_phase.empty() || ds.stall_phase == job->phase))  // tests: force the deadline
    std::this_thread::sleep_for(std::chrono::milliseconds(ds.stall_ms));
  if (job->dir->is_abandoned()) return;
  std::string error;
  if (job->phase == "prologue") prefetch_managed(*job, w.copy_stream(&error));
  if (!stage_arrays(*job, w)) return;
  // Reachable scope follows the pointers it reads; either scope notes pointers into
  // memory it does not capture (mapped host, IPC), so the agent can refuse the launch.
  PhaseJob* j = job.get();
  auto scan = [j](const DeviceRegion& region, const unsigned char* bytes, size_t n) {
    if (region.kind == "array") return;  // texels, not pointers
    for (size_t off = 0; off + 8 <= n; off += 8) {
      uint64_t v;
      std::memcpy(&v, bytes + off, 8);
      if (v < 4096) continue;
      Allocation a;
      if (j->reachable && MemoryWindow::instance().find(v, &a)) add_region_once(j->regions, j->bases, a);
      else if (j->foreign && j->foreign_refs.size() < 8 && find_foreign(v, nullptr)) j->foreign_refs.emplace_back(region.base, v);
    }
  };
  std::function<void(const DeviceRegion&, const unsigned char*, size_t)> scanner;
  if (job->phase == "prologue" && (job->reachable || job->foreign)) scanner = scan;
  job->ok = w.write(job->dir->path + "/" + job->phase, job->regions, scanner, job->byte_cap, &job->bytes, &job->error,
                    &job->digests);
  job->io_failure = !job->ok && w.last_failure_was_io();
  job->stripes = w.last_stripes();
  job->writer_wait = w.last_writer_wait_seconds();
  job->copy_wait = w.last_copy_wait_seconds();
  job->setup = w.last_setup_seconds();
  job->write = w.last_write_seconds();
  job->copied = w.last_copied_bytes();
  job->digest = w.last_digest_seconds();
  if (job->phase == "epilogue") free_staging(*job->recorder);
  job->seconds = seconds_since(t0);
  if (job->dir->is_abandoned()) remove_tree(job->dir->path);  // its recording gave up on it meanwhile
}

// Runs one snapshot phase on the worker, the gate's deadline extended to the
// phase's budget (the base plus its bytes, at least `min_bytes`). Late: *why
// says so.
Waited capture_phase(const Pending& p, const std::shared_ptr<PhaseJob>& job, uint64_t min_bytes, std::string* why) {
  uint64_t planned = 0;
  for (const auto& r : job->regions) planned += r.size;
  const double budget = deadline_seconds(std::max(planned, min_bytes));
  gate::extend(deadline_after(budget));
  const Waited w = run_on_worker(*p.recorder, [job] { run_phase(job); }, budget);
  if (w == Waited::late)
    *why = "the " + job->phase + " snapshot (" + bytes_text(planned) + ") did not finish within " +
           seconds_text(budget) + " (the deadline)";
  return w;
}

// ---- the recording of one launch -------------------------------------------

// The launch part of launch.json: what is known before the launch.
std::string launch_json(const Launch& l, const KernelState& ks, long index, uint64_t identity, CUdevice device,
                        long module_id, const Layout& layout, const std::vector<unsigned char>& args) {
  auto& d = driver();
  char arch[16], dname[256] = "";
  int major = 0, minor = 0;
  d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
  d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
  std::snprintf(arch, sizeof arch, "sm_%d%d", major, minor);
  d.cuDeviceGetName(dname, sizeof dname, device);
  std::ostringstream os;
  os << "\"kernel\": " << json_string(ks.name) << ", \"demangled\": " << json_string(demangle(ks.name))
     << ", \"api\": " << json_string(l.api) << ", \"launch_index\": " << index << ", \"identity\": \"" << std::hex
     << identity << std::dec << "\"" << ", \"device\": " << device << ", \"device_name\": " << json_string(dname)
     << ", \"arch\": \"" << arch << "\"" << ", \"grid\": " << dims_json(l.grid) << ", \"block\": " << dims_json(l.block)
     << ", \"shared_mem\": " << l.shared_mem << ", \"module_id\": " << module_id << ", \"param_offsets\": [";
  for (size_t i = 0; i < layout.params.size(); ++i) os << (i ? ", " : "") << layout.params[i].first;
  os << "], \"param_sizes\": [";
  for (size_t i = 0; i < layout.params.size(); ++i) os << (i ? ", " : "") << layout.params[i].second;
  os << "], \"param_buffer_size\": " << args.size() << ", \"args\": \"" << hex(args.data(), args.size()) << "\"";
  os << ", \"attributes\": [";
  for (size_t i = 0; i < l.attributes.size(); ++i) os << (i ? ", " : "") << l.attributes[i];
  os << "]";
  return os.str();
}

// Called at API enter of a launch (the thread has entered the gate): decide,
// reserve the instance, take the gate, capture the prologue. Every wait from
// the reservation on has a deadline; when one passes the instance is abandoned
// and the launch goes on.
void before_launch(const Launch& l, const char* symbol_name) {
  FunctionInfo* info = nullptr;
  if (!function_entry(l.f, symbol_name, &info)) return;
  KernelState& ks = *info->kernel;
  t_known[l.f] = &ks;
  if (!settings().eager_loading) t_launch_image = image_of_function(l.f);
  if (!ks.selected || captured_into_graph(l.stream, ks)) return;
  long index = 0;
  bool module_known = false;
  {
    TablesLock lock;
    if (!lock) return;
    index = ks.launches++;
    if (!index_selected(index) || slots_taken(ks)) return;
    module_known = module_of(ks.name) != nullptr;
  }
  if (access(spool("stop").c_str(), F_OK) == 0) {  // the agent cannot store more
    stop_recording("the record agent asked to stop (see its message)");
    return;
  }
  CUdevice device = 0;
  if (!device_selected(&device)) return;
  // Lazy loading: the kernel's module may not be in this context yet; load it
  // now (its module-loaded callback runs inside, and takes g_mu itself) so that
  // its code, globals and parameter layout are known before the prologue.
  if (!module_known) {
    gate::Away away;  // inside the recorder's graph launch: no owner waits for this load
    load_function(l.f);
  }
  CUresult lr = CUDA_SUCCESS;
  const Layout layout = function_layout(l.f, *info, &lr);
  if (!layout.known) {
    std::fprintf(stderr, "mneme record: warning: %s launch %ld not recorded: parameter layout unknown (%s; record"
                 " with --eager-loading)\n", ks.name.c_str(), index, error_string(lr));
    return;
  }
  std::vector<unsigned char> args;
  if (!param_bytes(l, layout, &args)) {
    std::fprintf(stderr, "mneme record: warning: %s launch %ld not recorded: cannot read its arguments\n",
                 ks.name.c_str(), index);
    return;
  }
  const uint64_t identity = launch_identity(l, args);

  // Reserve the instance: from here on the recording ends committed, abandoned or released.
  auto p = std::make_unique<Pending>();
  p->kernel = &ks;
  p->index = index;
  p->identity = identity;
  p->device = device;
  p->f = l.f;
  long module_id = -1;
  std::vector<std::string> globals;
  {
    TablesLock lock;
    if (!lock) return;
    if ((!settings().record_duplicates && ks.seen.count(identity)) || slots_taken(ks)) return;
    const ModuleInfo* mod = module_of(ks.name);
    if (!mod) {  // the agent could not name its code
      if (!ks.no_module_noted)
        std::fprintf(stderr, "mneme record: warning: %s launch %ld not recorded: the recorder saw no module defining"
                     " it (its code cannot be recorded)\n", ks.name.c_str(), index);
      ks.no_module_noted = true;
      return;
    }
    module_id = long(mod->id);
    globals = mod->globals;
    if (!settings().record_duplicates) p->identity_reserved = ks.seen.insert(identity).second;
    ks.pending++;
    g_in_flight++;
    p->token = ++g_launch_token;
  }
  p->launch_part = launch_json(l, ks, index, identity, device, module_id, layout, args);
  if (l.extra && !l.kernel_params) p->warnings.push_back("arguments passed through the `extra` buffer");

  // The spool's back-pressure, before the gate: only this thread waits for the agent.
  std::string why;
  bool room;
  {
    gate::Away away;  // no owner waits for this thread while it waits for the agent
    room = wait_for_spool_room(&p->spool_wait, &why);
  }
  if (!room) return abandon(std::move(p), why);

  switch (gate::acquire(deadline_after(deadline_seconds()), &why)) {
    case gate::Acquired::yes:
      break;
    case gate::Acquired::refused:
      if (settings().verbose)
        std::fprintf(stderr, "mneme record: %s launch %ld not recorded: %s\n", ks.name.c_str(), index, why.c_str());
      return release_unrecorded(std::move(p));
    case gate::Acquired::late:
      return abandon(std::move(p), why);
  }
  p->recorder = context_recorder(&p->ctx);
  if (!p->recorder || p->recorder->worker.busy()) {  // a job of an abandoned instance still runs there
    if (settings().verbose)
      std::fprintf(stderr, "mneme record: %s launch %ld not recorded: the recorder's worker is still busy with an"
                   " abandoned snapshot\n", ks.name.c_str(), index);
    return release_unrecorded(std::move(p));
  }
  CUresult sr = CUDA_SUCCESS;
  switch (synchronize_context(*p->recorder, p->ctx, &sr)) {
    case Waited::done:
      break;
    case Waited::late:
      return abandon(std::move(p), "the work queued before the launch did not finish within " +
                                       seconds_text(deadline_seconds()) + " (the deadline)");
    case Waited::busy:
      return release_unrecorded(std::move(p));
  }
  if (sr != CUDA_SUCCESS) {
    std::fprintf(stderr, "mneme record: warning: %s launch %ld not recorded: the context reports %s before it\n",
                 ks.name.c_str(), index, error_string(sr));
    return release_unrecorded(std::move(p));
  }

  // Regions: module globals first, then heap allocations.
  auto& d = driver();
  auto job = std::make_shared<PhaseJob>();
  job->ctx = p->ctx;
  job->recorder = p->recorder;
  job->phase = "prologue";
  job->device = device;
  job->byte_cap = settings().max_snapshot_bytes;
  CUmodule hmod = module_handle(l.f);
  if (hmod) {
    for (const auto& g : globals) {
      CUdeviceptr gp = 0;
      size_t gsize = 0;
      if (d.cuModuleGetGlobal_v2(&gp, &gsize, hmod, g.c_str()) == CUDA_SUCCESS && gsize && job->bases.insert(gp).second)
        job->regions.push_back(DeviceRegion{gp, gsize, "global", g, {}, 0, ""});
    }
  }
  auto allocations = MemoryWindow::instance().live_allocations(device);
  for (const auto& a : allocations)
    if (a.managed) job->managed.push_back(a.base);
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
  job->reachable = settings().snapshot_scope == "reachable" || !pool.empty();
  job->foreign = !foreign_ranges().empty();
  // Texture and surface objects alive now: their descriptors, the memory they read (reachable from
  // them) and their CUDA arrays (copied like regions); the agent decides which the kernel reaches.
  ObjectsAtLaunch objects;
  if (any_live_object()) objects = objects_at_launch();
  if (!job->reachable) {
    for (const auto& a : allocations) add_region_once(job->regions, job->bases, a);
  } else {
    std::vector<uint64_t> roots = objects.linear_addresses;
    for (size_t off = 0; off + 8 <= args.size(); off += 8) {  // pointer-sized, aligned argument words
      uint64_t v;
      std::memcpy(&v, args.data() + off, 8);
      roots.push_back(v);
    }
    for (uint64_t v : roots) {
      Allocation a;
      if (MemoryWindow::instance().find(v, &a)) add_region_once(job->regions, job->bases, a);
    }
  }
  for (const ArrayCapture& a : objects.arrays) {
    job->array_regions.push_back(job->regions.size());
    job->regions.push_back(DeviceRegion{reinterpret_cast<uint64_t>(a.array), a.bytes(), "array", "", {}, 0,
                                        a.shape_json()});
  }
  job->arrays = std::move(objects.arrays);
  p->memory_part = memory_json(device, allocations, job->reachable, pool, objects.json);

  p->dir = std::make_shared<EntryDir>();
  p->dir->path = spool("entries/t" + std::to_string(p->token) + ".tmp");
  job->dir = p->dir;
  if (!make_dirs(p->dir->path)) {
    stop_recording("cannot create the spool directory " + p->dir->path + ": " + std::strerror(errno));
    return release_unrecorded(std::move(p));
  }
  // Reachable scope discovers regions as it copies: budget for at least 1 GB.
  switch (capture_phase(*p, job, job->reachable ? 1ull << 30 : 0, &why)) {
    case Waited::done:
      break;
    case Waited::late:
      return abandon(std::move(p), why);
    case Waited::busy:
      return release_unrecorded(std::move(p));
  }
  if (!job->ok) {
    if (job->error == "snapshot exceeds the byte cap") {
      std::fprintf(stderr, "mneme record: warning: %s launch %ld not recorded: its snapshot exceeds"
                   " --max-snapshot-bytes=%llu (try --snapshot-scope reachable)\n", ks.name.c_str(), index,
                   (unsigned long long)settings().max_snapshot_bytes);
      return release_unrecorded(std::move(p));
    }
    if (job->io_failure) {
      if (p->dir) remove_tree(p->dir->path);  // first: a full disk must have room for error.json
      stop_recording(job->error);
      return release_unrecorded(std::move(p));
    }
    return abandon(std::move(p), "capturing the prologue failed: " + job->error);
  }
  p->prologue = job;
  gate::extend(deadline_after(deadline_seconds()));  // the launch itself, up to its exit callback
  t_pending = std::move(p);
}

// A pending launch that cannot be matched to its exit callback: its entry is
// removed, not committed (its epilogue would be taken after another launch).
void drop_pending(std::unique_ptr<Pending> p, const char* why) {
  std::fprintf(stderr, "mneme record: warning: %s: a recorded launch is dropped: %s\n", p->kernel->name.c_str(), why);
  release_unrecorded(std::move(p));
}

// At API exit of the launch: wait for it, capture the epilogue, commit (or
// abandon at a deadline). The gate opens at the end either way.
void after_launch(std::unique_ptr<Pending> p, CUresult launch_result) {
  if (launch_result != CUDA_SUCCESS) return release_unrecorded(std::move(p));  // the application sees the error itself
  const PhaseJob& pro = *p->prologue;
  CUresult r = CUDA_SUCCESS;
  gate::extend(deadline_after(deadline_seconds()));
  switch (synchronize_context(*p->recorder, p->ctx, &r)) {
    case Waited::done:
      break;
    case Waited::late:
      return abandon(std::move(p), "the launch did not finish within " + seconds_text(deadline_seconds()) +
                                       " (the deadline; --deadline for longer kernels)");
    case Waited::busy:
      return abandon(std::move(p), "the recorder's worker was busy at the epilogue");
  }
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "mneme record: warning: %s failed while recording (%s); this launch is not recorded\n",
                 p->kernel->name.c_str(), error_string(r));
    return release_unrecorded(std::move(p));
  }
  auto job = std::make_shared<PhaseJob>();
  job->ctx = p->ctx;
  job->recorder = p->recorder;
  job->dir = p->dir;
  job->phase = "epilogue";
  job->device = p->device;
  job->regions = pro.regions;  // the prologue's list (reachable discovery included): the same layout
  job->arrays = pro.arrays;    // copied again into the prologue's staging buffers
  job->array_regions = pro.array_regions;
  job->digests = pro.digests;
  std::string why;
  switch (capture_phase(*p, job, 0, &why)) {
    case Waited::done:
      break;
    case Waited::late:
      return abandon(std::move(p), why);
    case Waited::busy:
      return abandon(std::move(p), "the recorder's worker was busy at the epilogue");
  }
  if (!job->ok) {
    if (job->io_failure) {
      if (p->dir) remove_tree(p->dir->path);  // first: a full disk must have room for error.json
      stop_recording(job->error);
      return release_unrecorded(std::move(p));
    }
    return abandon(std::move(p), "capturing the epilogue failed: " + job->error);
  }
  if (job->stripes != pro.stripes) {  // cannot happen, as below
    stop_recording("internal error: prologue and epilogue stripe counts differ");
    return release_unrecorded(std::move(p));
  }
  std::vector<std::vector<Piece>> prologue_pieces;
  for (size_t i = 0; i < pro.regions.size(); ++i) {
    const auto& a = pro.regions[i].pieces;
    const auto& b = job->regions[i].pieces;
    bool same = a.size() == b.size();
    for (size_t k = 0; same && k < a.size(); ++k)
      same = a[k].stripe == b[k].stripe && a[k].offset == b[k].offset && a[k].size == b[k].size;
    if (!same) {  // cannot happen: the layout depends on the region list only
      stop_recording("internal error: prologue and epilogue layouts differ");
      return release_unrecorded(std::move(p));
    }
    prologue_pieces.push_back(a);
  }
  if (gate::broken(&why)) return abandon(std::move(p), why);

  std::ostringstream rest;
  rest << p->launch_part << ", " << p->memory_part << ", \"foreign_references\": [";
  for (size_t i = 0; i < pro.foreign_refs.size(); ++i)
    rest << (i ? ", " : "") << "{\"region\": " << pro.foreign_refs[i].first << ", \"target\": " << pro.foreign_refs[i].second
         << "}";
  rest << "], \"regions\": " << regions_json(job->regions, prologue_pieces) << ", \"prologue_bytes\": " << pro.bytes
       << ", \"epilogue_bytes\": " << job->bytes << ", \"prologue_seconds\": " << pro.seconds
       << ", \"epilogue_seconds\": " << job->seconds << ", \"prologue_wait_seconds\": {\"file_writes\": "
       << pro.writer_wait << ", \"copies\": " << pro.copy_wait << ", \"setup\": " << pro.setup << "}"
       << ", \"prologue_write_seconds\": " << pro.write << ", \"epilogue_write_seconds\": " << job->write
       << ", \"spool_wait_seconds\": " << p->spool_wait << ", \"prologue_copied_bytes\": " << pro.copied
       << ", \"epilogue_copied_bytes\": " << job->copied << ", \"prologue_digest_seconds\": " << pro.digest
       << ", \"epilogue_digest_seconds\": " << job->digest << ", \"warnings\": " << strings_json(p->warnings);
  std::string error;
  bool committed;
  {
    std::lock_guard<std::mutex> lock(g_commit_mu);
    long seq = 0;
    committed = commit_dir(p->dir->path, "\"stripes\": " + std::to_string(job->stripes), rest.str(), &seq, &error);
    if (committed) {
      char name[32];
      std::snprintf(name, sizeof name, "%08ld", seq);
      g_committed.emplace_back(spool(std::string("entries/") + name), pro.copied + job->copied);
      // Under the commit lock: a later snapshot may leave these pieces out only
      // once this entry has its number, below any entry that does.
      p->recorder->writer.remember(job->digests);
    }
  }
  if (!committed) {
    stop_recording(error);
    return release_unrecorded(std::move(p));
  }
  for (const auto& w : p->warnings)
    std::fprintf(stderr, "mneme record: warning: %s: %s\n", p->kernel->name.c_str(), w.c_str());
  gate::release();
  finish_pending(*p, Outcome::committed);
}

// Inside the driver (it may hold its own module-loading lock): takes only g_mu.
void on_module_loaded(const CUpti_ResourceData* rd) {
  auto* md = static_cast<const CUpti_ModuleResourceData*>(rd->resourceDescriptor);
  t_module_loaded = true;
  if (!md || g_disabled) return;
  // Eager loading: the load call in progress. Lazy: the launch that loads it.
  const void* image = t_loading_image ? t_loading_image : t_launch_image;
  if (!md->pCubin || !md->cubinSize) {  // kernels unknown: launches must be watched
    if (settings().verbose) std::fprintf(stderr, "mneme record: module %u loaded without its image\n", md->moduleId);
    {
      TablesLock lock;
      if (!lock) return;
      g_unknown_module = true;
    }
    return apply_launch_callbacks();
  }
  CubinSymbols syms = read_cubin_symbols(md->pCubin, md->cubinSize);
  bool wanted = !syms.readable, first_time = false;
  {
    TablesLock lock;
    if (!lock) {
      std::fprintf(stderr, "mneme record: warning: module %u could not be noted; its kernels are not recorded\n",
                   md->moduleId);
      return;
    }
    ModuleInfo info;
    info.id = md->moduleId;
    info.kernels.insert(syms.kernels.begin(), syms.kernels.end());
    info.globals = syms.globals;
    g_modules.push_back(std::move(info));
    // Only a module that defines a selected kernel can be named by an entry:
    // the others are not written (large applications load hundreds of them).
    for (const auto& k : syms.kernels) {
      if (name_selected(k)) {
        g_candidates.insert(k);
        wanted = true;
      }
    }
    if (!syms.readable) g_unknown_module = true;
    first_time = wanted && g_modules_written.insert(md->moduleId).second;
    // Written under the lock: a launch of one of its kernels reserves its
    // instance only after that (module_of), so the module is on file before
    // any entry that names it.
    if (first_time) {
      if (settings().verbose)
        std::fprintf(stderr, "mneme record: module %u loaded: %zu kernels%s, kept\n", md->moduleId,
                     syms.kernels.size(), syms.readable ? "" : " (symbols unreadable)");
      std::string base = spool("modules/" + std::to_string(md->moduleId));
      std::string error;
      if (!make_dirs(spool("modules"))) {
        stop_recording("cannot create " + spool("modules"));
      } else if (!write_file_atomic(base + ".cubin", md->pCubin, md->cubinSize, &error)) {
        stop_recording(error);
      } else {
        const char* source_kind = "";
        const void* source = nullptr;
        size_t source_size = image ? image_size(image, &source_kind, &source) : 0;
        if (source_size && !write_file_atomic(base + ".src", source, source_size, &error)) {
          stop_recording(error);
        } else {
          std::ostringstream os;
          os << "{\"module_id\": " << md->moduleId << ", \"cubin_size\": " << md->cubinSize
             << ", \"source_kind\": " << json_string(source_size ? source_kind : "") << ", \"source_size\": "
             << source_size << ", \"kernels\": " << strings_json(syms.kernels) << ", \"globals\": "
             << strings_json(syms.globals) << "}\n";
          std::string body = os.str();
          if (!write_file_atomic(base + ".json", body.data(), body.size(), &error)) stop_recording(error);
        }
      }
    } else if (settings().verbose) {
      std::fprintf(stderr, "mneme record: module %u loaded: %zu kernels%s\n", md->moduleId, syms.kernels.size(),
                   syms.readable ? "" : " (symbols unreadable)");
    }
  }
  apply_launch_callbacks();
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
    case CUPTI_DRIVER_TRACE_CBID_cuTexObjectCreate: {
      auto* p = static_cast<const cuTexObjectCreate_params*>(params);
      note_object(ObjectKind::texture, *p->pTexObject, true);
      note_texture_object(*p->pTexObject, p->pResDesc, p->pTexDesc, p->pResViewDesc);
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuTexObjectDestroy: {
      const uint64_t handle = static_cast<const cuTexObjectDestroy_params*>(params)->texObject;
      note_object(ObjectKind::texture, handle, false);
      forget_texture_object(handle);
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuSurfObjectCreate: {
      auto* p = static_cast<const cuSurfObjectCreate_params*>(params);
      note_object(ObjectKind::surface, *p->pSurfObject, true);
      note_surface_object(*p->pSurfObject, p->pResDesc);
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuSurfObjectDestroy: {
      const uint64_t handle = static_cast<const cuSurfObjectDestroy_params*>(params)->surfObject;
      note_object(ObjectKind::surface, handle, false);
      forget_surface_object(handle);
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuArrayCreate_v2:
      note_array(*static_cast<const cuArrayCreate_v2_params*>(params)->pHandle, "created");
      break;
    case CUPTI_DRIVER_TRACE_CBID_cuArray3DCreate_v2:
      note_array(*static_cast<const cuArray3DCreate_v2_params*>(params)->pHandle, "created");
      break;
    case CUPTI_DRIVER_TRACE_CBID_cuMipmappedArrayGetLevel:
      note_array(*static_cast<const cuMipmappedArrayGetLevel_params*>(params)->pLevelArray, "mipmap level");
      break;
    case CUPTI_DRIVER_TRACE_CBID_cuArrayDestroy:
      forget_array(static_cast<const cuArrayDestroy_params*>(params)->hArray);
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

}  // namespace

Prospect recording_prospect(const Launch& l) {
  if (g_disabled) return Prospect::never;
  FunctionInfo* info = nullptr;
  if (!function_entry(l.f, nullptr, &info)) return Prospect::never;
  const KernelState& ks = *info->kernel;
  CUdevice device = 0;
  if (!ks.selected || ks.finished || !device_selected(&device)) return Prospect::never;
  if (settings().record_duplicates) return Prospect::maybe;
  CUresult why = CUDA_SUCCESS;
  const Layout layout = function_layout(l.f, *info, &why);
  std::vector<unsigned char> args;
  if (!layout.known || !param_bytes(l, layout, &args)) return Prospect::maybe;
  const uint64_t identity = launch_identity(l, args);
  TablesLock lock;
  if (!lock) return Prospect::never;
  return ks.seen.count(identity) ? Prospect::seen : Prospect::maybe;
}

std::string kernel_name(CUfunction f) {
  FunctionInfo* info = nullptr;
  if (!function_entry(f, nullptr, &info)) return "";
  return info->kernel->name;
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
  if (cbid == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch || cbid == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz) {
    // A graph launched whole changes memory like a launch: it waits at the gate while another launch is recorded.
    if (enter) gate::enter(gate::graph_launch);
    else gate::leave(gate::graph_launch);
  }
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
    case CUPTI_DRIVER_TRACE_CBID_cuArrayCreate_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuArray3DCreate_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMipmappedArrayGetLevel:
    case CUPTI_DRIVER_TRACE_CBID_cuArrayDestroy:
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
        if (!t_launched) {
          t_launched = true;
          g_launch_threads.fetch_add(1);
        }
        t_callbacks_went_off = false;
        if (t_pending) drop_pending(std::move(t_pending), "its launch's exit callback never came");
        t_launch_image = nullptr;  // before_launch sets it where the module may load inside this launch
        CUfunction f = launched_function(cbid, cb);
        if (f && launch_needs_look(f)) before_launch(launch_of(cbid, cb), cb->symbolName);
        if (t_pending) {
          t_pending->cbid = cbid;
          if (cb->correlationData) *cb->correlationData = t_pending->token;
        }
        // Every watched launch, right before the driver runs it: it waits here
        // while another thread's launch is recorded (the recording thread owns
        // the gate and passes). Not when this callback switched the launch
        // callbacks off: its exit callback will not come.
        if (!t_callbacks_went_off) gate::enter(gate::launch_callback);
      } else {
        t_launch_image = nullptr;
        if (t_pending) {
          std::unique_ptr<Pending> p = std::move(t_pending);
          if (p->cbid == cbid && p->f == launched_function(cbid, cb) &&
              (!cb->correlationData || *cb->correlationData == p->token))
            after_launch(std::move(p), *static_cast<const CUresult*>(cb->functionReturnValue));
          else
            drop_pending(std::move(p), "an exit callback of another launch came before its own");
        }
        gate::leave(gate::launch_callback);
      }
    }
  }
  t_inside = false;
}

void set_launch_callback_switch(void (*enable)(bool)) {
  {
    TablesLock lock;
    if (!lock) return;
    g_launch_switch = enable;
  }
  apply_launch_callbacks();  // lazy loading: on from the start (every launch is watched)
}

void write_recorder_info(const char* cupti_path) {
  const Settings& s = settings();
  make_dirs(spool("entries"));
  make_dirs(spool("modules"));
  std::ostringstream os;
  os << "{\"format\": \"mneme-spool/1\", \"pid\": " << getpid() << ", \"rank\": " << json_string(s.rank)
     << ", \"va_base\": " << s.va_base << ", \"va_size\": " << s.va_size << ", \"cupti\": " << json_string(cupti_path)
     << ", \"deadline_seconds\": " << deadline_settings().base_s << "}\n";
  std::string body = os.str(), error;
  if (!write_file_atomic(spool("recorder.json"), body.data(), body.size(), &error)) stop_recording(error);
}

void write_done_marker() {
  std::ostringstream os;
  os << "{\"launches_seen\": " << g_launches_seen.load() << ", \"recorded\": " << g_recorded.load()
     << ", \"abandoned\": " << g_abandoned.load() << ", \"graph_launches\": " << graph_launches()
     << ", \"graph_launches_expanded\": " << graph_launches_expanded() << ", \"error\": " << json_string(g_error)
     << "}\n";
  std::string body = os.str(), error;
  write_file_atomic(spool("done.json"), body.data(), body.size(), &error);
}

// The recorder's cuGraphLaunch (graph_expansion.cpp) counts as a launch at the gate.
void enter_graph_launch() {
  if (!t_inside) gate::enter(gate::graph_launch);
}
void leave_graph_launch() {
  if (!t_inside) gate::leave(gate::graph_launch);
}

}  // namespace mneme::rec
