// The replay engine: device memory, modules, timed launches, device compares.
//
// Deliberately narrow: it knows nothing about recordings, configurations or
// verdicts. The Python layer (mneme.replay) decides what to restore, what to
// load, what to compare and what the numbers mean.
#pragma once

#include "driver.hpp"

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mneme {

// One CUDA device's primary context and the engine's stream on it.
class ContextState {
public:
    explicit ContextState(int ordinal);
    ~ContextState();
    ContextState(const ContextState&) = delete;
    ContextState& operator=(const ContextState&) = delete;

    void make_current() const;
    int ordinal;
    CUdevice device = 0;
    CUcontext context = nullptr;
    CUstream stream = nullptr;
    CUmodule compare_module = nullptr;
    CUfunction bytes_diff = nullptr;
    CUfunction spin = nullptr;
    CUfunction l2_scrub = nullptr;
    CUfunction hash_elems = nullptr;
    CUdeviceptr scrub_buffer = 0;  // lazily allocated, scrub_bytes long (+16 for the sink)
    uint64_t scrub_bytes = 0;
    void ensure_scrub(uint64_t bytes);
    std::map<int, CUfunction> tolerance_kernels;  // dtype code -> kernel
    int sm_count = 0;
    std::vector<CUevent> events;                   // pool, grows on demand
    void ensure_events(size_t n);
    // run_batch's gate: a word of pinned host memory the device reads (mapped), the value that
    // opens the next gate, and the kernel that waits for it (all made on first use).
    volatile uint32_t* gate_host = nullptr;
    CUdeviceptr gate_device = 0;
    uint32_t gate_value = 0;
    CUfunction wait_flag = nullptr;
    void ensure_gate();
    // Batches in flight own events and result buffers (pinned host + device) taken from these pools
    // and given back once waited for, so that enqueueing a batch allocates nothing.
    struct SpareBuffers { void* host; CUdeviceptr device; size_t bytes; };
    std::vector<CUevent> spare_events;
    std::vector<SpareBuffers> spare_buffers;
    std::map<void*, size_t> buffer_sizes;
    // Batches whose GPU work may still run when nobody waits for them any more (dropped, or an error
    // while enqueueing): their buffers and events go back to the pools once `fence` (the last of
    // `events`, recorded after all their work) has completed, seen without waiting (reclaim).
    struct Pending { void* host; CUdeviceptr device; std::vector<CUevent> events; };
    std::vector<Pending> pending;
    // The pools and pending are touched with the GIL released, and a BatchRun may be dropped in
    // another thread than the one that waits for another batch.
    std::mutex pool_mutex;
    CUevent take_event();
    std::pair<void*, CUdeviceptr> take_buffers(size_t bytes);
    void give_back(void* host, CUdeviceptr device, std::vector<CUevent>& events_used);
    // Gives back at once when the last event has completed, else later (reclaim); never waits.
    void give_back_when_done(void* host, CUdeviceptr device, std::vector<CUevent>& events_used);
    void reclaim();
    void free_batch_pools();
    // Modules no one refers to any more, unloaded once the stream is idle: cuModuleUnload may wait for
    // the device, and a batch whose results are taken (which drops the last reference to a module)
    // may have another batch enqueued behind it, whose kernel may never end.
    std::vector<CUmodule> idle_unloads;
    void unload_when_idle(CUmodule module);  // at once when the stream is idle; never waits
    void unload_idle_modules();              // those waiting, if the stream is idle now; never waits
};
using ContextPtr = std::shared_ptr<ContextState>;

// A virtual address range reserved at a fixed base, with physical memory mapped
// into parts of it on demand (the recorded window).
class Reservation {
public:
    Reservation(ContextPtr ctx, uint64_t base, uint64_t size);
    ~Reservation();
    // offset/size multiples of granularity; the memory lives on `device` (an ordinal; -1: the
    // reservation's own device), so one process-wide reservation can serve every GPU.
    void map(uint64_t offset, uint64_t size, int device = -1);
    void unmap(uint64_t offset, uint64_t size);  // exactly a range given to map()
    void release();
    uint64_t base() const { return base_; }
    uint64_t size() const { return size_; }
    uint64_t mapped_bytes() const { return mapped_bytes_; }
    uint64_t granularity() const { return granularity_; }

private:
    ContextPtr ctx_;
    uint64_t base_ = 0, size_ = 0, granularity_ = 0, mapped_bytes_ = 0;
    bool reserved_ = false;
    struct Mapping { uint64_t address, size; CUmemGenericAllocationHandle handle; };
    std::vector<Mapping> mappings_;
};

class Function {
public:
    Function(ContextPtr ctx, std::shared_ptr<CUmodule> module, CUfunction fn, std::string name)
        : ctx(std::move(ctx)), module(std::move(module)), fn(fn), name(std::move(name)) {}
    std::map<std::string, int> attributes() const;
    void set_attribute(const std::string& which, int value);
    std::vector<std::pair<size_t, size_t>> param_info() const;
    ContextPtr ctx;
    std::shared_ptr<CUmodule> module;  // keeps the module loaded while the function lives
    CUfunction fn;
    std::string name;
};

class Module {
public:
    Module(ContextPtr ctx, const std::string& image, const std::map<std::string, int>& jit_options);
    Function function(const std::string& name) const;
    std::pair<uint64_t, uint64_t> global(const std::string& name) const;  // (address, size)
    ContextPtr ctx;
    std::shared_ptr<CUmodule> module;
    std::string info_log, error_log;
    double load_seconds = 0;
};

// A device-side comparison of `size` bytes at `actual` against `expected`.
// dtype < 0: bytewise. Otherwise a typed tolerance comparison (see compare_kernels.cu)
// whose elements violate by `mode`: 0 absolute, 1 relative, 2 ULP distance > threshold.
// hash_elem (1, 2, 4 or 8; 0: none) also hashes both sides as elements of that size.
struct Check {
    uint64_t actual = 0, expected = 0, size = 0;
    int dtype = -1;
    int mode = 0;
    double threshold = 0;
    unsigned hash_elem = 0;
};

// What one check gathered: 7 double statistics, 5 counters, and (hash_elem) the multiset
// and positional hashes of each side (compare_kernels.cu).
// For a bytewise check: counters[0] = differing bytes, counters[1] = first offset.
struct CheckResult {
    std::array<double, 7> stats{};
    std::array<uint64_t, 5> counters{};
    std::array<uint64_t, 6> hashes{};  // actual: multiset, multiset', positional; then expected's
};

struct Copy { uint64_t dst, src, size; };

// A CUDA array (cuArray3DCreate with the recorded descriptor), destroyed with the object or by free().
class CudaArray {
public:
    CudaArray(ContextPtr ctx, const CUDA_ARRAY3D_DESCRIPTOR& desc);
    ~CudaArray();
    CudaArray(const CudaArray&) = delete;
    CudaArray& operator=(const CudaArray&) = delete;
    uint64_t handle() const { return reinterpret_cast<uint64_t>(array_); }
    void free();

private:
    ContextPtr ctx_;
    CUarray array_ = nullptr;
};

// A texture object (cuTexObjectCreate) or a surface object (cuSurfObjectCreate), destroyed with the
// object or by free().
class SamplerObject {
public:
    SamplerObject(ContextPtr ctx, const CUDA_RESOURCE_DESC& resource, const CUDA_TEXTURE_DESC* texture,
                  const CUDA_RESOURCE_VIEW_DESC* view);  // texture null: a surface object
    ~SamplerObject();
    SamplerObject(const SamplerObject&) = delete;
    SamplerObject& operator=(const SamplerObject&) = delete;
    uint64_t handle() const { return handle_; }
    bool surface() const { return surface_; }
    void free();

private:
    ContextPtr ctx_;
    uint64_t handle_ = 0;
    bool surface_ = false;
};

// The contents of a CUDA array as packed rows in linear device memory: `width_bytes` per row,
// `height` rows per slice, `depth` slices (1 for 1-D and 2-D arrays).
struct ArrayCopy { uint64_t array = 0, linear = 0, width_bytes = 0, height = 1, depth = 1; };

// Copies linear memory into the array (to_array) or the array into linear memory, on `stream`
// (asynchronous), or synchronously when `stream` is null.
void copy_array(const ContextState& ctx, const ArrayCopy& c, bool to_array, CUstream stream);

// A launch attribute for cuLaunchKernelEx: its CUlaunchAttributeID and the bytes of its
// CUlaunchAttributeValue (the Python layer decides which attributes a replay may carry).
struct LaunchAttr {
    int id = 0;
    std::string value;  // at most sizeof(CUlaunchAttributeValue) bytes; the rest is zero
};

// How a launch is made beyond grid, block and shared memory.
struct LaunchSpec {
    std::vector<LaunchAttr> attributes;  // non-empty: cuLaunchKernelEx with these
    // Where each of the function's parameters starts in the argument bytes. Non-empty: the
    // launch passes kernelParams (pointers into the bytes), else the bytes go through `extra`.
    std::vector<size_t> param_offsets;
    // CUDA arrays: filled from linear memory before each launch (with the resets), and copied into
    // linear memory after each checked launch, before the checks compare it.
    std::vector<ArrayCopy> array_resets;
    std::vector<ArrayCopy> array_readbacks;
};

struct RunResult {
    std::vector<int64_t> times_ns;                     // one per launch
    std::vector<std::vector<CheckResult>> checks;      // one list per checked launch
    std::vector<int> checked_launches;                 // which launches were checked
    int64_t wall_ns = 0;                               // host time from first enqueue to completion
    int64_t gpu_span_ns = 0;                           // GPU time from the first launch's start event to the last's stop
    std::vector<int64_t> event_times_ns;               // the events' times (== times_ns unless CUPTI timed)
};

// Element size of a tolerance dtype code; the codes are mneme/replay/tolerance.py's.
size_t dtype_size(int dtype);

// The timed replay loop: for each launch reset (copies, then spec.array_resets), record, launch,
// record, then compare when the launch is in check_launches (spec.array_readbacks first). With
// queue_ahead_ns > 0 a spin kernel runs first, so the loop is enqueued while the GPU is busy and the
// launches run back to back (events then time kernels, not host enqueueing).
RunResult run_launches(const Function& f, std::array<unsigned, 3> grid, std::array<unsigned, 3> block,
                       unsigned shared_mem, const std::string& args, int launches, const std::vector<Copy>& resets,
                       const std::vector<Check>& checks, const std::vector<int>& check_launches,
                       uint64_t queue_ahead_ns, uint64_t l2_scrub_bytes, double timeout_s, bool cupti = false,
                       const LaunchSpec& spec = {});

// One configuration of a batch (start_batch): the launches of `function` with `before` copied first
// (the full reset from the recorded memory), then per launch as run_launches does them.
struct BatchItem {
    std::shared_ptr<Function> function;
    std::array<unsigned, 3> grid{1, 1, 1}, block{1, 1, 1};
    unsigned shared_mem = 0;
    std::string args;
    int launches = 1;
    std::vector<Copy> before;
    std::vector<Copy> resets;
    std::vector<Check> checks;
    std::vector<int> check_launches;
    LaunchSpec spec;
};

// Several configurations enqueued in one call, then waited for once: each item's copies, launches
// (events around each) and comparisons go into the stream behind a gate (a kernel waiting for a
// host-written word) that opens once all of them are enqueued, so the events time kernels, not
// enqueueing, and the GPU runs the items back to back. Nothing in enqueueing waits for the GPU (the
// comparisons' results come back by an asynchronous copy into pinned memory): the next batch is
// enqueued while this one runs, and its gate is open before the GPU reaches it. No CUPTI, no L2 scrub.
class BatchRun {
public:
    BatchRun(ContextPtr ctx, std::vector<BatchItem> items, uint64_t gate_max_ns);
    ~BatchRun();
    BatchRun(const BatchRun&) = delete;
    BatchRun& operator=(const BatchRun&) = delete;
    // One RunResult per item, once the GPU is done (timeout_s > 0 bounds the wait); wall_ns is the
    // batch's, from its first enqueue.
    std::vector<RunResult> wait(double timeout_s);
    // Whether the GPU is done with it (or failed: wait() says how), without waiting.
    bool done() const;

private:
    struct Prepared;
    void enqueue(uint64_t gate_max_ns);
    ContextPtr ctx;
    std::vector<BatchItem> items;
    std::vector<Prepared> prepared;
    std::vector<CUevent> events;  // two per launch, then one after everything
    void* host = nullptr;         // pinned: the comparisons' results
    CUdeviceptr device = 0;
    size_t slots = 0;
    int64_t t0 = 0;
    bool waited = false;
};

std::shared_ptr<BatchRun> start_batch(const ContextPtr& ctx, std::vector<BatchItem> items, uint64_t gate_max_ns);
// start_batch, then wait.
std::vector<RunResult> run_batch(const ContextPtr& ctx, std::vector<BatchItem> items, double timeout_s,
                                 uint64_t gate_max_ns);

// Compare once, now (outside a run).
std::vector<CheckResult> compare(const ContextPtr& ctx, const std::vector<Check>& checks);

}  // namespace mneme
