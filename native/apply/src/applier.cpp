#include "applier.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "mneme/common/driver_api.hpp"
#include "mneme/common/elf_symbols.hpp"
#include "mneme/common/gpu_digest.hpp"
#include "mneme/common/text.hpp"

#include "plan.hpp"

namespace mneme::apply {
namespace {

using common::demangle;
using common::driver;
using common::error_string;
using common::json_string;

struct EntryState {
  const PlanEntry* plan = nullptr;
  std::string label;  // demangled name and static hash, for messages
  long launches = 0, applied = 0, verified = 0, verify_failed = 0;
  std::map<std::string, long> left_alone;  // reason -> launches
  std::string disabled;                    // non-empty: every later launch is left alone for this reason
  std::map<CUcontext, CUfunction> tuned;   // the tuned code, loaded once per context
  std::string image;                       // the tuned cubin's bytes (read once)
};

struct State {
  Plan plan;
  bool verbose = false;
  std::vector<EntryState> entries;
  std::unordered_map<std::string, size_t> by_name;
  std::unordered_map<std::string, std::set<uint64_t>> module_fnv;  // kernel name -> loaded module cubins
  std::unordered_map<CUfunction, long> functions;                  // -> entry index, -1: not planned
  std::map<CUcontext, std::string> device_mismatch;                // per context: "" when it matches
  std::map<CUcontext, common::GpuDigest> digests;
  std::string report_path;
};

std::mutex g_mu;
// Set while this thread decides a launch: modules loaded then are our own (the
// tuned code, the digest kernel), never the application's, and the
// module-loaded callback they raise must neither count them nor take the lock.
thread_local bool t_deciding = false;

struct Deciding {
  Deciding() { t_deciding = true; }
  ~Deciding() { t_deciding = false; }
};

void write_report();

State& state() {
  static State* s = [] {
    auto* st = new State();
    const char* path = std::getenv("MNEME_APPLY_PLAN");
    if (!path || !*path) return st;
    st->plan = read_plan(path);
    if (!st->plan.loaded) {
      std::fprintf(stderr, "mneme apply: error: %s; the application runs unchanged\n", st->plan.error.c_str());
      return st;
    }
    const char* v = std::getenv("MNEME_VERBOSE");
    st->verbose = v && std::strcmp(v, "1") == 0;
    if (const char* r = std::getenv("MNEME_APPLY_REPORT")) st->report_path = r;
    st->entries.resize(st->plan.entries.size());
    for (size_t i = 0; i < st->plan.entries.size(); ++i) {
      auto& e = st->entries[i];
      e.plan = &st->plan.entries[i];
      e.label = demangle(e.plan->name) + " (static hash " + e.plan->static_hash + ")";
      st->by_name[e.plan->name] = i;
      if (!e.plan->code_path.empty()) {
        std::ifstream in(e.plan->code_path, std::ios::binary);
        e.image.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        if (e.image.empty()) e.disabled = "the tuned code " + e.plan->code_path + " cannot be read";
      }
    }
    std::atexit(write_report);
    return st;
  }();
  return *s;
}

std::string function_name(CUfunction f) {
  auto& d = driver();
  const char* n = nullptr;
  if (d.cuFuncGetName && d.cuFuncGetName(&n, f) == CUDA_SUCCESS && n) return n;
  // cudart (CUDA 12+) launches CUkernel handles through cuLaunchKernel.
  CUfunction in_context = nullptr;
  if (d.cuKernelGetFunction && d.cuKernelGetFunction(&in_context, reinterpret_cast<CUkernel>(f)) == CUDA_SUCCESS &&
      d.cuFuncGetName && d.cuFuncGetName(&n, in_context) == CUDA_SUCCESS && n)
    return n;
  return "";
}

std::string dims(const unsigned v[3]) {
  return std::to_string(v[0]) + "x" + std::to_string(v[1]) + "x" + std::to_string(v[2]);
}

// "" when this context's GPU and driver are those of the tuning run (or --apply-force).
const std::string& device_check(State& st, CUcontext ctx) {
  auto it = st.device_mismatch.find(ctx);
  if (it != st.device_mismatch.end()) return it->second;
  std::string why;
  auto& d = driver();
  CUdevice dev = 0;
  int major = 0, minor = 0, version = 0;
  if (d.cuCtxGetDevice(&dev) == CUDA_SUCCESS) {
    d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  }
  if (d.cuDriverGetVersion) d.cuDriverGetVersion(&version);
  if (!st.plan.force) {
    if (major != st.plan.cc_major || minor != st.plan.cc_minor)
      why = "the GPU is sm_" + std::to_string(major) + std::to_string(minor) + ", tuned on sm_" +
            std::to_string(st.plan.cc_major) + std::to_string(st.plan.cc_minor) + " (--apply-force applies anyway)";
    else if (st.plan.driver_version && version != st.plan.driver_version)
      why = "the CUDA driver is " + std::to_string(version) + ", tuned with " + std::to_string(st.plan.driver_version) +
            " (--apply-force applies anyway)";
  }
  return st.device_mismatch.emplace(ctx, why).first->second;
}

bool same(const unsigned a[3], const unsigned b[3]) { return a[0] == b[0] && a[1] == b[1] && a[2] == b[2]; }

// Why this launch keeps the application's own code and shape ("" when it may be applied);
// *shape: the tuned launch.
std::string check(State& st, EntryState& e, const LaunchCall& c, CUcontext ctx, Shape* shape) {
  if (!e.disabled.empty()) return e.disabled;
  const std::string& dev = device_check(st, ctx);
  if (!dev.empty()) return dev;
  const PlanEntry& p = *e.plan;
  if (p.cubin_fnv) {
    auto it = st.module_fnv.find(p.name);
    if (it == st.module_fnv.end() || it->second.empty())
      return "its module was not seen loading, so its code cannot be checked (is CUDA_MODULE_LOADING=EAGER set?)";
    if (it->second.size() != 1 || *it->second.begin() != p.cubin_fnv)
      return "its code differs from the tuned recording's (rebuilt application?)";
  }
  *shape = p.tuned;
  if (!same(c.block, p.recorded.block) || c.shared_mem != p.recorded.shared_mem)
    return "launch shape differs from the recorded one (block " + dims(c.block) + ", shared " +
           std::to_string(c.shared_mem) + ")";
  if (!same(c.grid, p.recorded.grid)) {
    if (!p.similar) return "grid " + dims(c.grid) + " differs from the recorded " + dims(p.recorded.grid) +
                           " (--apply-to similar applies it)";
    for (int a = 0; a < 3; ++a) {  // keep the launch's coverage: ceil(grid * block / tuned block)
      unsigned long long total = 1ull * c.grid[a] * c.block[a];
      unsigned long long g = (total + p.tuned.block[a] - 1) / p.tuned.block[a];
      if (g == 0 || g > (a == 0 ? 0x7fffffffull : 65535ull)) return "the similar launch's grid would exceed CUDA's limits";
      shape->grid[a] = unsigned(g);
    }
  }
  if (c.ex) {
    for (unsigned i = 0; i < c.ex->numAttrs; ++i) {
      auto id = c.ex->attrs[i].id;
      if (id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION || id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE)
        return "launched with cluster or cooperative attributes";
    }
  }
  if (!p.fixed.empty()) {
    if (!c.params) return "arguments passed through 'extra' cannot be checked against the specialized values";
    for (const auto& [index, bytes] : p.fixed)
      if (std::memcmp(c.params[index], bytes.data(), bytes.size()) != 0)
        return "argument " + std::to_string(index) + " differs from the value the tuned code was specialized on";
  }
  return "";
}

// The tuned function in this context ('f' itself when only the shape changes); null and *why on failure.
CUfunction tuned_function(EntryState& e, CUfunction f, CUcontext ctx, std::string* why) {
  if (e.plan->code_path.empty()) return f;
  auto it = e.tuned.find(ctx);
  if (it != e.tuned.end()) return it->second;
  auto& d = driver();
  CUmodule m = nullptr;
  CUfunction fn = nullptr;
  CUresult r = d.cuModuleLoadData(&m, e.image.data());
  if (r == CUDA_SUCCESS) r = d.cuModuleGetFunction(&fn, m, e.plan->name.c_str());
  if (r == CUDA_SUCCESS && e.plan->tuned.shared_mem > 48 * 1024 && d.cuFuncSetAttribute)
    r = d.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(e.plan->tuned.shared_mem));
  if (r != CUDA_SUCCESS) {
    *why = std::string("the tuned code did not load: ") + error_string(r);
    return nullptr;
  }
  e.tuned.emplace(ctx, fn);
  return fn;
}

CUresult raw_launch(const LaunchCall& c, CUfunction f, const Shape& s) {
  auto& d = driver();
  if (c.ex) {
    CUlaunchConfig cfg = *c.ex;
    cfg.gridDimX = s.grid[0], cfg.gridDimY = s.grid[1], cfg.gridDimZ = s.grid[2];
    cfg.blockDimX = s.block[0], cfg.blockDimY = s.block[1], cfg.blockDimZ = s.block[2];
    cfg.sharedMemBytes = s.shared_mem;
    auto fn = c.per_thread_stream ? d.cuLaunchKernelEx_ptsz : d.cuLaunchKernelEx;
    return fn ? fn(&cfg, f, c.params, c.extra) : CUDA_ERROR_NOT_SUPPORTED;
  }
  auto fn = c.per_thread_stream ? d.cuLaunchKernel_ptsz : d.cuLaunchKernel;
  if (!fn) return CUDA_ERROR_NOT_SUPPORTED;
  return fn(f, s.grid[0], s.grid[1], s.grid[2], s.block[0], s.block[1], s.block[2], s.shared_mem, c.stream, c.params,
            c.extra);
}

Shape original_shape(const LaunchCall& c) {
  Shape s;
  std::memcpy(s.grid, c.grid, sizeof s.grid);
  std::memcpy(s.block, c.block, sizeof s.block);
  s.shared_mem = c.shared_mem;
  return s;
}

struct Region {
  CUdeviceptr base = 0;
  size_t size = 0;
};

// The allocations the pointer arguments name (deduplicated).
std::vector<Region> argument_regions(const EntryState& e, const LaunchCall& c) {
  std::vector<Region> out;
  for (const auto& [index, offset] : e.plan->pointers) {
    CUdeviceptr p = 0;
    std::memcpy(&p, static_cast<const char*>(c.params[index]) + offset, sizeof p);
    Region r;
    if (!p || driver().cuMemGetAddressRange_v2(&r.base, &r.size, p) != CUDA_SUCCESS) continue;
    bool seen = false;
    for (const auto& o : out) seen = seen || o.base == r.base;
    if (!seen) out.push_back(r);
  }
  return out;
}

bool digest_regions(common::GpuDigest& g, const std::vector<Region>& regions, CUstream s,
                    std::vector<common::Digest>* out, std::string* why) {
  std::vector<std::pair<CUdeviceptr, uint64_t>> pieces;
  const uint64_t piece = 16ull << 20;
  for (const auto& r : regions)
    for (uint64_t off = 0; off < r.size; off += piece) pieces.emplace_back(r.base + off, std::min<uint64_t>(piece, r.size - off));
  return g.compute(pieces, s, out, why);
}

// --apply-verify: the tuned and the original launch on the same inputs, compared on the device.
// The memory ends with the original's results whatever the outcome. *passed: whether they agreed.
CUresult verified_launch(State& st, EntryState& e, const LaunchCall& c, CUfunction tuned, const Shape& shape,
                         CUcontext ctx, bool* passed, std::string* why) {
  auto& d = driver();
  *passed = false;
  if (!c.params) {
    *why = "cannot verify: arguments passed through 'extra'";
    return raw_launch(c, c.f, original_shape(c));
  }
  common::GpuDigest& g = st.digests[ctx];
  if (!g.available()) {
    *why = "cannot verify: the device-side digest kernel is not available (MNEME_DIGESTS=0, or built without nvcc)";
    return raw_launch(c, c.f, original_shape(c));
  }
  CUstream s = (c.per_thread_stream && c.stream == nullptr) ? CU_STREAM_PER_THREAD : c.stream;
  std::vector<Region> regions = argument_regions(e, c);
  size_t total = 0;
  for (const auto& r : regions) total += r.size;
  CUdeviceptr backup = 0;
  if (total && d.cuMemAlloc_v2(&backup, total) != CUDA_SUCCESS) {
    *why = "cannot verify: no device memory for a copy of the arguments' " + std::to_string(total) + " bytes";
    return raw_launch(c, c.f, original_shape(c));
  }
  auto copy_all = [&](bool to_backup) {
    size_t off = 0;
    CUresult r = CUDA_SUCCESS;
    for (const auto& reg : regions) {
      if (r == CUDA_SUCCESS)
        r = to_backup ? d.cuMemcpyDtoDAsync_v2(backup + off, reg.base, reg.size, s)
                      : d.cuMemcpyDtoDAsync_v2(reg.base, backup + off, reg.size, s);
      off += reg.size;
    }
    return r;
  };
  std::vector<common::Digest> tuned_digest, original_digest;
  CUresult r = copy_all(true);
  if (r == CUDA_SUCCESS) r = raw_launch(c, tuned, shape);
  bool tuned_ok = r == CUDA_SUCCESS && digest_regions(g, regions, s, &tuned_digest, why);
  if (r != CUDA_SUCCESS) *why = std::string("the tuned launch failed: ") + error_string(r);
  r = copy_all(false);
  if (r == CUDA_SUCCESS) r = raw_launch(c, c.f, original_shape(c));
  bool original_ok = r == CUDA_SUCCESS && digest_regions(g, regions, s, &original_digest, why);
  if (backup) {
    d.cuStreamSynchronize(s);
    d.cuMemFree_v2(backup);
  }
  if (r != CUDA_SUCCESS) return r;
  if (tuned_ok && original_ok) {
    *passed = tuned_digest == original_digest;
    if (!*passed) *why = "its results differed from the original's";
  }
  return r;
}

void note(State& st, EntryState& e, const std::string& why) {
  e.left_alone[why]++;
  if (st.verbose)
    std::fprintf(stderr, "mneme apply: %s launch %ld: left alone: %s\n", e.label.c_str(), e.launches, why.c_str());
}

void write_report() {
  State& st = state();
  std::FILE* out = st.report_path.empty() ? nullptr : std::fopen(st.report_path.c_str(), "w");
  for (auto& e : st.entries) {
    long alone = 0;
    std::string reasons, reasons_json;
    for (const auto& [why, n] : e.left_alone) {
      alone += n;
      reasons += (reasons.empty() ? "" : "; ") + std::to_string(n) + " because " + why;
      reasons_json += (reasons_json.empty() ? "" : ", ") + json_string(why) + ": " + std::to_string(n);
    }
    std::string line = e.label + ": applied " + std::to_string(e.applied) + " of " + std::to_string(e.launches) +
                       " launches";
    if (st.plan.verify) line += ", comparisons passed " + std::to_string(e.verified) + " of " +
                                std::to_string(e.verified + e.verify_failed);
    if (alone) line += "; left alone " + std::to_string(alone) + " (" + reasons + ")";
    if (e.launches == 0) line += " (never launched)";
    std::fprintf(stderr, "mneme apply: %s\n", line.c_str());
    if (out)
      std::fprintf(out,
                   "{\"kernel\": %s, \"static_hash\": %s, \"launches\": %ld, \"applied\": %ld, \"verified\": %ld, "
                   "\"verify_failed\": %ld, \"left_alone\": {%s}}\n",
                   json_string(e.plan->name).c_str(), json_string(e.plan->static_hash).c_str(), e.launches, e.applied,
                   e.verified, e.verify_failed, reasons_json.c_str());
  }
  if (out) std::fclose(out);
}

}  // namespace

bool active() { return state().plan.loaded; }

void on_module_loaded(const void* cubin, size_t size) {
  State& st = state();
  if (t_deciding || !st.plan.loaded || !cubin || !size) return;
  common::CubinSymbols syms = common::read_cubin_symbols(cubin, size);
  std::lock_guard<std::mutex> lock(g_mu);
  uint64_t h = 0;
  for (const auto& k : syms.kernels) {
    if (!st.by_name.count(k)) continue;
    if (!h) h = fnv1a64(cubin, size);
    st.module_fnv[k].insert(h);
  }
}

CUresult launch(const LaunchCall& c) {
  State& st = state();
  if (!st.plan.loaded || st.entries.empty()) return raw_launch(c, c.f, original_shape(c));
  std::unique_lock<std::mutex> lock(g_mu);
  Deciding deciding;
  auto it = st.functions.find(c.f);
  if (it == st.functions.end()) {
    auto found = st.by_name.find(function_name(c.f));
    it = st.functions.emplace(c.f, found == st.by_name.end() ? -1 : long(found->second)).first;
  }
  if (it->second < 0) {
    t_deciding = false;
    lock.unlock();
    return raw_launch(c, c.f, original_shape(c));
  }
  EntryState& e = st.entries[size_t(it->second)];
  e.launches++;
  CUcontext ctx = nullptr;
  driver().cuCtxGetCurrent(&ctx);
  Shape shape;
  std::string why = check(st, e, c, ctx, &shape);
  CUfunction tuned = why.empty() ? tuned_function(e, c.f, ctx, &why) : nullptr;
  if (!tuned) {
    if (why.rfind("the tuned code", 0) == 0) e.disabled = why;
    note(st, e, why);
    t_deciding = false;
    lock.unlock();
    return raw_launch(c, c.f, original_shape(c));
  }
  if (e.verified + e.verify_failed < st.plan.verify) {
    bool passed = false;
    CUresult r = verified_launch(st, e, c, tuned, shape, ctx, &passed, &why);
    if (passed) {
      e.verified++;
      e.applied++;
      if (st.verbose)
        std::fprintf(stderr, "mneme apply: %s launch %ld: applied and verified (grid %s, block %s, shared %u)\n",
                     e.label.c_str(), e.launches, dims(shape.grid).c_str(), dims(shape.block).c_str(), shape.shared_mem);
    } else if (why == "its results differed from the original's") {
      e.verify_failed++;
      e.disabled = "rolled back: the tuned code's results differed from the original's at a verified launch";
      std::fprintf(stderr, "mneme apply: warning: %s: the tuned launch's results differ from the original's; "
                   "the original's are kept and the kernel runs unchanged from now on\n", e.label.c_str());
      note(st, e, e.disabled);
    } else {
      e.disabled = why;
      note(st, e, why);
    }
    return r;
  }
  e.applied++;
  if (st.verbose)
    std::fprintf(stderr, "mneme apply: %s launch %ld: applied (grid %s, block %s, shared %u)\n", e.label.c_str(),
                 e.launches, dims(shape.grid).c_str(), dims(shape.block).c_str(), shape.shared_mem);
  t_deciding = false;
  lock.unlock();
  return raw_launch(c, tuned, shape);
}

}  // namespace mneme::apply
