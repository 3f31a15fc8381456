// The replay engine's device work (see engine.hpp).
#include "engine.hpp"

#include "cupti_timer.hpp"
#include "compare_fatbin.h"  // generated: mneme_compare_fatbin[] (compare_kernels.cu)

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

namespace mneme {
namespace {

// dtype codes shared with mneme/replay/tolerance.py (DTYPE_CODES).
struct DtypeInfo { int code; const char* kernel; size_t size; };
constexpr DtypeInfo kDtypes[] = {
    {0, "mneme_tol_u8", 1},   {1, "mneme_tol_i8", 1},    {2, "mneme_tol_u16", 2},  {3, "mneme_tol_i16", 2},
    {4, "mneme_tol_u32", 4},  {5, "mneme_tol_i32", 4},   {6, "mneme_tol_u64", 8},  {7, "mneme_tol_i64", 8},
    {8, "mneme_tol_f16", 2},  {9, "mneme_tol_bf16", 2},  {10, "mneme_tol_f32", 4}, {11, "mneme_tol_f64", 8},
};

// One check result: 7 doubles, 5 counters, then 2 x 3 hashes (actual, expected) (compare_kernels.cu).
constexpr size_t kDoubles = 7, kCounters = 5, kHashes = 6;
constexpr size_t kSlotWords = kDoubles + kCounters + kHashes;
constexpr size_t kSlotBytes = kSlotWords * 8;

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Initial contents of a result slot: zeros, and "none" (~0) as the first differing index,
// which both kernels keep in counters[1] with atomicMin.
void init_slot(uint64_t* slot) {
    std::memset(slot, 0, kSlotBytes);
    slot[kDoubles + 1] = ~0ull;
}

void enqueue_hash(const ContextState& ctx, CUdeviceptr data, uint64_t size, unsigned elem, CUdeviceptr out,
                  unsigned blocks, unsigned threads) {
    unsigned long long n = size / elem;
    void* params[] = {&data, &n, &elem, &out};
    check(driver().cuLaunchKernel(ctx.hash_elems, blocks, 1, 1, threads, 1, 1, 0, ctx.stream, params, nullptr),
          "cuLaunchKernel(hash elements)");
}

void enqueue_check(const ContextState& ctx, const Check& c, CUdeviceptr slot) {
    const Driver& d = driver();
    CUdeviceptr dstats = slot;
    CUdeviceptr counters = slot + kDoubles * 8;
    unsigned threads = 256;
    uint64_t elements = c.dtype < 0 ? c.size / 16 + 1 : c.size / dtype_size(c.dtype);
    uint64_t want = (elements + threads * 4 - 1) / (threads * 4);
    unsigned blocks = static_cast<unsigned>(std::max<uint64_t>(1, std::min<uint64_t>(want, ctx.sm_count * 8ull)));
    if (c.dtype < 0) {
        CUdeviceptr a = c.actual, b = c.expected;
        unsigned long long n = c.size;
        void* params[] = {&a, &b, &n, &counters};
        check(d.cuLaunchKernel(ctx.bytes_diff, blocks, 1, 1, threads, 1, 1, 0, ctx.stream, params, nullptr),
              "cuLaunchKernel(compare bytes)");
    } else {
        auto it = ctx.tolerance_kernels.find(c.dtype);
        if (it == ctx.tolerance_kernels.end()) throw std::invalid_argument("unknown tolerance dtype code");
        CUdeviceptr a = c.actual, b = c.expected;
        unsigned long long n = c.size / dtype_size(c.dtype);
        double thr = c.threshold;
        int mode = c.mode;
        void* params[] = {&a, &b, &n, &thr, &mode, &dstats, &counters};
        check(d.cuLaunchKernel(it->second, blocks, 1, 1, threads, 1, 1, 0, ctx.stream, params, nullptr),
              "cuLaunchKernel(compare tolerance)");
    }
    if (c.hash_elem) {
        CUdeviceptr hashes = slot + (kDoubles + kCounters) * 8;
        enqueue_hash(ctx, c.actual, c.size, c.hash_elem, hashes, blocks, threads);
        enqueue_hash(ctx, c.expected, c.size, c.hash_elem, hashes + 3 * 8, blocks, threads);
    }
}

// A device buffer freed when it goes out of scope.
struct DeviceScratch {
    CUdeviceptr ptr = 0;
    explicit DeviceScratch(size_t bytes) {
        if (bytes) check(driver().cuMemAlloc(&ptr, bytes), "cuMemAlloc(compare results)");
    }
    ~DeviceScratch() {
        if (ptr && !driver_cleanup_abandoned()) driver().cuMemFree(ptr);
    }
};

std::vector<CheckResult> unpack(const std::vector<uint64_t>& host, size_t first_slot, size_t count) {
    std::vector<CheckResult> out(count);
    for (size_t i = 0; i < count; ++i) {
        const uint64_t* slot = host.data() + (first_slot + i) * kSlotWords;
        std::memcpy(out[i].stats.data(), slot, kDoubles * 8);
        std::memcpy(out[i].counters.data(), slot + kDoubles, kCounters * 8);
        std::memcpy(out[i].hashes.data(), slot + kDoubles + kCounters, kHashes * 8);
    }
    return out;
}

// Wait until `query` (cuStreamQuery or cuEventQuery of what is awaited) stops answering NOT_READY,
// polling, for timeout_s at most: a hanging kernel cannot block forever.
template <typename Query>
void poll_until_done(Query query, double timeout_s, const char* call) {
    int64_t deadline = now_ns() + static_cast<int64_t>(timeout_s * 1e9);
    int spins = 0;
    for (;;) {
        CUresult r = query();
        if (r == CUDA_SUCCESS) return;
        if (r != CUDA_ERROR_NOT_READY) check(r, call);
        if (now_ns() > deadline) {
            // The kernel still runs: anything that frees memory now would wait for it forever.
            abandon_driver_cleanup();
            throw CudaError(CUDA_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT",
                            "waiting for the replayed kernel (timeout " + std::to_string(timeout_s) + " s)");
        }
        if (++spins < 2000) std::this_thread::yield();
        else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

// Wait for the stream; with a timeout, poll so a hanging kernel cannot block forever.
void wait_stream(const ContextState& ctx, double timeout_s) {
    const Driver& d = driver();
    if (timeout_s <= 0) {
        check(d.cuStreamSynchronize(ctx.stream), "cuStreamSynchronize");
        return;
    }
    poll_until_done([&] { return d.cuStreamQuery(ctx.stream); }, timeout_s, "cuStreamQuery");
}

}  // namespace

size_t dtype_size(int dtype) {
    for (const auto& info : kDtypes)
        if (info.code == dtype) return info.size;
    throw std::invalid_argument("unknown tolerance dtype code " + std::to_string(dtype));
}

// ---------------------------------------------------------------- ContextState
ContextState::ContextState(int ordinal_) : ordinal(ordinal_) {
    const Driver& d = driver();
    int count = 0;
    check(d.cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (ordinal < 0 || ordinal >= count)
        throw std::invalid_argument("device " + std::to_string(ordinal) + " does not exist: this machine has " +
                                    std::to_string(count) + " CUDA device(s), numbered from 0");
    check(d.cuDeviceGet(&device, ordinal), "cuDeviceGet");
    check(d.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
    make_current();
    check(d.cuDeviceGetAttribute(&sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
          "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)");
    // A blocking stream: it orders with the synchronous copies of the legacy default stream.
    check(d.cuStreamCreate(&stream, CU_STREAM_DEFAULT), "cuStreamCreate");
    // The driver wants the fatbin 8-byte aligned; the embedded array is only byte-aligned.
    std::vector<uint64_t> fatbin((sizeof(mneme_compare_fatbin) + 7) / 8);
    std::memcpy(fatbin.data(), mneme_compare_fatbin, sizeof(mneme_compare_fatbin));
    check(d.cuModuleLoadDataEx(&compare_module, fatbin.data(), 0, nullptr, nullptr),
          "cuModuleLoadDataEx(engine compare kernels)");
    check(d.cuModuleGetFunction(&bytes_diff, compare_module, "mneme_bytes_diff"), "cuModuleGetFunction");
    check(d.cuModuleGetFunction(&spin, compare_module, "mneme_spin"), "cuModuleGetFunction");
    check(d.cuModuleGetFunction(&l2_scrub, compare_module, "mneme_l2_scrub"), "cuModuleGetFunction");
    check(d.cuModuleGetFunction(&hash_elems, compare_module, "mneme_hash_elems"), "cuModuleGetFunction");
    for (const auto& info : kDtypes) {
        CUfunction fn = nullptr;
        check(d.cuModuleGetFunction(&fn, compare_module, info.kernel), "cuModuleGetFunction");
        tolerance_kernels[info.code] = fn;
    }
}

ContextState::~ContextState() {
    if (driver_cleanup_abandoned()) return;
    const Driver& d = driver();
    d.cuCtxSetCurrent(context);
    for (CUevent e : events) d.cuEventDestroy(e);
    if (scrub_buffer) d.cuMemFree(scrub_buffer);
    free_batch_pools();
    unload_idle_modules();  // (left when the stream still runs: unloading would wait for it)
    if (compare_module) d.cuModuleUnload(compare_module);
    if (stream) d.cuStreamDestroy(stream);
    d.cuDevicePrimaryCtxRelease(device);
}

void ContextState::make_current() const { check(driver().cuCtxSetCurrent(context), "cuCtxSetCurrent"); }

void ContextState::ensure_events(size_t n) {
    while (events.size() < n) {
        CUevent e = nullptr;
        check(driver().cuEventCreate(&e, CU_EVENT_DEFAULT), "cuEventCreate");
        events.push_back(e);
    }
}

void ContextState::ensure_scrub(uint64_t bytes) {
    bytes = (bytes + 15) / 16 * 16;
    if (bytes <= scrub_bytes) return;
    const Driver& d = driver();
    if (scrub_buffer) d.cuMemFree(scrub_buffer);
    scrub_buffer = 0;
    scrub_bytes = 0;
    check(d.cuMemAlloc(&scrub_buffer, bytes + 16), "cuMemAlloc(L2 scrub buffer)");
    check(d.cuMemsetD8(scrub_buffer, 0, bytes + 16), "cuMemsetD8(L2 scrub buffer)");
    scrub_bytes = bytes;
}

// ------------------------------------------------------------------ Reservation
Reservation::Reservation(ContextPtr ctx, uint64_t base, uint64_t size) : ctx_(std::move(ctx)), base_(base) {
    const Driver& d = driver();
    ctx_->make_current();
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ctx_->device;
    size_t gran = 0;
    check(d.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity");
    granularity_ = gran;
    if (base % gran != 0)
        throw std::invalid_argument("window base " + std::to_string(base) + " is not a multiple of the granularity " +
                                    std::to_string(gran));
    size_ = (size + gran - 1) / gran * gran;
    CUdeviceptr got = 0;
    check(d.cuMemAddressReserve(&got, size_, 0, base, 0), "cuMemAddressReserve");
    if (got != base) {
        d.cuMemAddressFree(got, size_);
        throw CudaError(CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE",
                        "cuMemAddressReserve at the recorded base (the driver offered another address: the range "
                        "is taken in this process)");
    }
    reserved_ = true;
}

Reservation::~Reservation() {
    try {
        release();
    } catch (...) {
    }
}

void Reservation::map(uint64_t offset, uint64_t size, int device) {
    const Driver& d = driver();
    if (!reserved_) throw std::runtime_error("the reservation was released");
    if (offset % granularity_ || size % granularity_ || size == 0 || offset + size > size_)
        throw std::invalid_argument("map range must be non-empty, granularity-aligned and inside the reservation");
    ctx_->make_current();
    CUdevice target = ctx_->device;
    if (device >= 0) check(d.cuDeviceGet(&target, device), "cuDeviceGet");
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = target;
    CUmemGenericAllocationHandle handle{};
    check(d.cuMemCreate(&handle, size, &prop, 0), "cuMemCreate");
    CUresult r = d.cuMemMap(base_ + offset, size, 0, handle, 0);
    if (r != CUDA_SUCCESS) {
        d.cuMemRelease(handle);
        check(r, "cuMemMap");
    }
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = d.cuMemSetAccess(base_ + offset, size, &access, 1);
    if (r != CUDA_SUCCESS) {
        d.cuMemUnmap(base_ + offset, size);
        d.cuMemRelease(handle);
        check(r, "cuMemSetAccess");
    }
    mappings_.push_back({base_ + offset, size, handle});
    mapped_bytes_ += size;
}

void Reservation::unmap(uint64_t offset, uint64_t size) {
    const Driver& d = driver();
    for (auto it = mappings_.begin(); it != mappings_.end(); ++it) {
        if (it->address == base_ + offset && it->size == size) {
            ctx_->make_current();
            check(d.cuMemUnmap(it->address, it->size), "cuMemUnmap");
            check(d.cuMemRelease(it->handle), "cuMemRelease");
            mapped_bytes_ -= it->size;
            mappings_.erase(it);
            return;
        }
    }
    throw std::invalid_argument("unmap: no mapping at that offset with that size");
}

void Reservation::release() {
    if (!reserved_ || driver_cleanup_abandoned()) return;
    const Driver& d = driver();
    d.cuCtxSetCurrent(ctx_->context);
    for (const auto& m : mappings_) {
        d.cuMemUnmap(m.address, m.size);
        d.cuMemRelease(m.handle);
    }
    mappings_.clear();
    mapped_bytes_ = 0;
    d.cuMemAddressFree(base_, size_);
    reserved_ = false;
}

// ----------------------------------------------------------------- Module, Function
Module::Module(ContextPtr ctx_, const std::string& image, const std::map<std::string, int>& jit)
    : ctx(std::move(ctx_)) {
    const Driver& d = driver();
    ctx->make_current();
    static const std::map<std::string, CUjit_option> kOptions = {
        {"optimization_level", CU_JIT_OPTIMIZATION_LEVEL}, {"max_registers", CU_JIT_MAX_REGISTERS},
        {"generate_line_info", CU_JIT_GENERATE_LINE_INFO}, {"generate_debug_info", CU_JIT_GENERATE_DEBUG_INFO},
        {"threads_per_block", CU_JIT_THREADS_PER_BLOCK},
    };
    std::vector<char> info(16384, 0), error(16384, 0);
    std::vector<CUjit_option> opts = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                                      CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    std::vector<void*> values = {info.data(), reinterpret_cast<void*>(info.size()), error.data(),
                                 reinterpret_cast<void*>(error.size())};
    for (const auto& [name, value] : jit) {
        auto it = kOptions.find(name);
        if (it == kOptions.end()) throw std::invalid_argument("unknown JIT option '" + name + "'");
        opts.push_back(it->second);
        values.push_back(reinterpret_cast<void*>(static_cast<uintptr_t>(static_cast<unsigned>(value))));
    }
    std::string padded = image;
    padded.push_back('\0');  // PTX images must be NUL-terminated; harmless after an ELF image
    CUmodule mod = nullptr;
    auto t0 = now_ns();
    CUresult r = d.cuModuleLoadDataEx(&mod, padded.data(), static_cast<unsigned>(opts.size()), opts.data(),
                                      values.data());
    load_seconds = (now_ns() - t0) * 1e-9;
    info_log = info.data();
    error_log = error.data();
    if (r != CUDA_SUCCESS) {
        std::string call = "cuModuleLoadDataEx";
        if (!error_log.empty()) call += " (" + error_log + ")";
        check(r, call.c_str());
    }
    ContextPtr keep = ctx;
    module = std::shared_ptr<CUmodule>(new CUmodule(mod), [keep](CUmodule* m) {
        if (driver_cleanup_abandoned()) {
            delete m;
            return;
        }
        keep->unload_when_idle(*m);  // not while work enqueued on the stream may still run
        delete m;
    });
}

Function Module::function(const std::string& name) const {
    ctx->make_current();
    CUfunction fn = nullptr;
    check(driver().cuModuleGetFunction(&fn, *module, name.c_str()), ("cuModuleGetFunction(" + name + ")").c_str());
    return Function(ctx, module, fn, name);
}

std::pair<uint64_t, uint64_t> Module::global(const std::string& name) const {
    ctx->make_current();
    CUdeviceptr ptr = 0;
    size_t bytes = 0;
    check(driver().cuModuleGetGlobal(&ptr, &bytes, *module, name.c_str()), ("cuModuleGetGlobal(" + name + ")").c_str());
    return {ptr, bytes};
}

std::map<std::string, int> Function::attributes() const {
    static const std::pair<const char*, CUfunction_attribute> kAttrs[] = {
        {"max_threads_per_block", CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK},
        {"shared_size_bytes", CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES},
        {"const_size_bytes", CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES},
        {"local_size_bytes", CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES},
        {"num_regs", CU_FUNC_ATTRIBUTE_NUM_REGS},
        {"ptx_version", CU_FUNC_ATTRIBUTE_PTX_VERSION},
        {"binary_version", CU_FUNC_ATTRIBUTE_BINARY_VERSION},
        {"max_dynamic_shared_size_bytes", CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES},
    };
    ctx->make_current();
    std::map<std::string, int> out;
    for (const auto& [name, attr] : kAttrs) {
        int v = -1;
        check(driver().cuFuncGetAttribute(&v, attr, fn), "cuFuncGetAttribute");
        out[name] = v;
    }
    return out;
}

void Function::set_attribute(const std::string& which, int value) {
    ctx->make_current();
    if (which == "max_dynamic_shared_size_bytes")
        check(driver().cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, value),
              "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    else
        throw std::invalid_argument("unknown settable function attribute '" + which + "'");
}

std::vector<std::pair<size_t, size_t>> Function::param_info() const {
    ctx->make_current();
    std::vector<std::pair<size_t, size_t>> out;
    for (size_t i = 0;; ++i) {
        size_t offset = 0, size = 0;
        CUresult r = driver().cuFuncGetParamInfo(fn, i, &offset, &size);
        if (r == CUDA_ERROR_INVALID_VALUE) break;  // past the last parameter
        check(r, "cuFuncGetParamInfo");
        out.emplace_back(offset, size);
    }
    return out;
}

// ------------------------------------------------------- arrays, texture and surface objects
CudaArray::CudaArray(ContextPtr ctx, const CUDA_ARRAY3D_DESCRIPTOR& desc) : ctx_(std::move(ctx)) {
    ctx_->make_current();
    check(driver().cuArray3DCreate(&array_, &desc), "cuArray3DCreate");
}

CudaArray::~CudaArray() {
    try {
        free();
    } catch (...) {
    }
}

void CudaArray::free() {
    if (!array_ || driver_cleanup_abandoned()) return;
    const Driver& d = driver();
    d.cuCtxSetCurrent(ctx_->context);
    d.cuArrayDestroy(array_);
    array_ = nullptr;
}

SamplerObject::SamplerObject(ContextPtr ctx, const CUDA_RESOURCE_DESC& resource, const CUDA_TEXTURE_DESC* texture,
                             const CUDA_RESOURCE_VIEW_DESC* view)
    : ctx_(std::move(ctx)), surface_(texture == nullptr) {
    const Driver& d = driver();
    ctx_->make_current();
    if (surface_) {
        CUsurfObject s = 0;
        check(d.cuSurfObjectCreate(&s, &resource), "cuSurfObjectCreate");
        handle_ = s;
    } else {
        CUtexObject t = 0;
        check(d.cuTexObjectCreate(&t, &resource, texture, view), "cuTexObjectCreate");
        handle_ = t;
    }
}

SamplerObject::~SamplerObject() {
    try {
        free();
    } catch (...) {
    }
}

void SamplerObject::free() {
    if (!handle_ || driver_cleanup_abandoned()) return;
    const Driver& d = driver();
    d.cuCtxSetCurrent(ctx_->context);
    if (surface_) d.cuSurfObjectDestroy(handle_);
    else d.cuTexObjectDestroy(handle_);
    handle_ = 0;
}

void copy_array(const ContextState& ctx, const ArrayCopy& c, bool to_array, CUstream stream) {
    CUDA_MEMCPY3D p{};
    CUarray array = reinterpret_cast<CUarray>(c.array);
    if (to_array) {
        p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
        p.srcDevice = c.linear;
        p.srcPitch = c.width_bytes;
        p.srcHeight = c.height;
        p.dstMemoryType = CU_MEMORYTYPE_ARRAY;
        p.dstArray = array;
    } else {
        p.srcMemoryType = CU_MEMORYTYPE_ARRAY;
        p.srcArray = array;
        p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        p.dstDevice = c.linear;
        p.dstPitch = c.width_bytes;
        p.dstHeight = c.height;
    }
    p.WidthInBytes = c.width_bytes;
    p.Height = c.height;
    p.Depth = c.depth;
    const Driver& d = driver();
    if (stream) {
        check(d.cuMemcpy3DAsync(&p, stream),
              to_array ? "cuMemcpy3DAsync(to a CUDA array)" : "cuMemcpy3DAsync(from a CUDA array)");
    } else {
        ctx.make_current();
        check(d.cuMemcpy3D(&p), to_array ? "cuMemcpy3D(to a CUDA array)" : "cuMemcpy3D(from a CUDA array)");
    }
}

// ------------------------------------------------------------------- launches
RunResult run_launches(const Function& f, std::array<unsigned, 3> grid, std::array<unsigned, 3> block,
                       unsigned shared_mem, const std::string& args, int launches, const std::vector<Copy>& resets,
                       const std::vector<Check>& checks, const std::vector<int>& check_launches,
                       uint64_t queue_ahead_ns, uint64_t l2_scrub_bytes, double timeout_s, bool cupti,
                       const LaunchSpec& spec) {
    const Driver& d = driver();
    ContextState& ctx = *f.ctx;
    ctx.make_current();
    if (launches < 1) throw std::invalid_argument("launches must be at least 1");
    ctx.ensure_events(2 * static_cast<size_t>(launches));
    if (l2_scrub_bytes) ctx.ensure_scrub(l2_scrub_bytes);
    unsigned long long scrub_words = l2_scrub_bytes / 16;
    CUdeviceptr scrub_ptr = ctx.scrub_buffer, scrub_sink = ctx.scrub_buffer + ctx.scrub_bytes;
    void* scrub_params[] = {&scrub_ptr, &scrub_words, &scrub_sink};
    unsigned scrub_blocks = static_cast<unsigned>(ctx.sm_count * 4);

    RunResult result;
    for (int i : check_launches) {
        if (i < 0 || i >= launches) throw std::invalid_argument("check_launches names a launch that does not exist");
        if (!result.checked_launches.empty() && i <= result.checked_launches.back())
            throw std::invalid_argument("check_launches must be sorted and distinct");
        result.checked_launches.push_back(i);
    }
    size_t slots = result.checked_launches.size() * checks.size();
    std::vector<uint64_t> host(slots * kSlotWords);
    for (size_t s = 0; s < slots; ++s) init_slot(host.data() + s * kSlotWords);
    DeviceScratch scratch(slots * kSlotBytes);
    if (slots) check(d.cuMemcpyHtoD(scratch.ptr, host.data(), slots * kSlotBytes), "cuMemcpyHtoD(compare slots)");

    // The argument bytes exactly as recorded: one pointer per parameter into them when the
    // layout is known (what cudart does; cooperative launches accept nothing else), else
    // the whole buffer through `extra`.
    std::string arg_copy = args;
    size_t arg_size = arg_copy.size();
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, arg_copy.data(), CU_LAUNCH_PARAM_BUFFER_SIZE, &arg_size,
                     CU_LAUNCH_PARAM_END};
    std::vector<void*> kernel_params;
    for (size_t off : spec.param_offsets) {
        if (off >= arg_size) throw std::invalid_argument("a parameter offset lies past the argument bytes");
        kernel_params.push_back(arg_copy.data() + off);
    }
    void** params_ptr = kernel_params.empty() ? nullptr : kernel_params.data();
    void** extra_ptr = (arg_size && !params_ptr) ? extra : nullptr;
    std::vector<CUlaunchAttribute> attrs(spec.attributes.size());
    for (size_t i = 0; i < attrs.size(); ++i) {
        const LaunchAttr& a = spec.attributes[i];
        if (a.value.size() > sizeof(CUlaunchAttributeValue))
            throw std::invalid_argument("a launch attribute value is longer than CUlaunchAttributeValue");
        std::memset(&attrs[i], 0, sizeof(CUlaunchAttribute));
        attrs[i].id = static_cast<CUlaunchAttributeID>(a.id);
        std::memcpy(&attrs[i].value, a.value.data(), a.value.size());
    }
    CUlaunchConfig config{};
    config.gridDimX = grid[0], config.gridDimY = grid[1], config.gridDimZ = grid[2];
    config.blockDimX = block[0], config.blockDimY = block[1], config.blockDimZ = block[2];
    config.sharedMemBytes = shared_mem;
    config.hStream = ctx.stream;
    config.attrs = attrs.data();
    config.numAttrs = static_cast<unsigned>(attrs.size());
    auto launch = [&]() {
        if (attrs.empty())
            check(d.cuLaunchKernel(f.fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared_mem,
                                   ctx.stream, params_ptr, extra_ptr),
                  "cuLaunchKernel");
        else
            check(d.cuLaunchKernelEx(&config, f.fn, params_ptr, extra_ptr), "cuLaunchKernelEx");
    };

    if (cupti) cupti_begin();
    size_t checked = 0;
    int64_t t0 = now_ns();
    if (queue_ahead_ns) {
        unsigned long long ns = queue_ahead_ns;
        void* params[] = {&ns};
        check(d.cuLaunchKernel(ctx.spin, 1, 1, 1, 1, 1, 1, 0, ctx.stream, params, nullptr), "cuLaunchKernel(spin)");
    }
    for (int i = 0; i < launches; ++i) {
        for (const Copy& c : resets)
            check(d.cuMemcpyDtoDAsync(c.dst, c.src, c.size, ctx.stream), "cuMemcpyDtoDAsync(reset)");
        for (const ArrayCopy& c : spec.array_resets) copy_array(ctx, c, true, ctx.stream);
        if (scrub_words)
            check(d.cuLaunchKernel(ctx.l2_scrub, scrub_blocks, 1, 1, 256, 1, 1, 0, ctx.stream, scrub_params, nullptr),
                  "cuLaunchKernel(L2 scrub)");
        check(d.cuEventRecord(ctx.events[2 * i], ctx.stream), "cuEventRecord");
        launch();
        check(d.cuEventRecord(ctx.events[2 * i + 1], ctx.stream), "cuEventRecord");
        if (checked < result.checked_launches.size() && result.checked_launches[checked] == i) {
            for (const ArrayCopy& c : spec.array_readbacks) copy_array(ctx, c, false, ctx.stream);
            for (size_t k = 0; k < checks.size(); ++k)
                enqueue_check(ctx, checks[k], scratch.ptr + (checked * checks.size() + k) * kSlotBytes);
            ++checked;
        }
    }
    wait_stream(ctx, timeout_s);
    result.wall_ns = now_ns() - t0;
    ctx.unload_idle_modules();  // the stream is idle now
    for (int i = 0; i < launches; ++i) {
        float ms = 0;
        check(d.cuEventElapsedTime(&ms, ctx.events[2 * i], ctx.events[2 * i + 1]), "cuEventElapsedTime");
        result.times_ns.push_back(static_cast<int64_t>(std::llround(static_cast<double>(ms) * 1e6)));
    }
    result.event_times_ns = result.times_ns;
    if (cupti) {
        auto spans = cupti_collect(ctx.context, ctx.stream, f.name);
        if (spans.size() != static_cast<size_t>(launches))
            throw std::runtime_error("CUPTI reported " + std::to_string(spans.size()) + " kernel records for " +
                                     std::to_string(launches) + " launches of " + f.name);
        for (int i = 0; i < launches; ++i)
            result.times_ns[i] = static_cast<int64_t>(spans[i].second - spans[i].first);
    }
    float span_ms = 0;
    check(d.cuEventElapsedTime(&span_ms, ctx.events[0], ctx.events[2 * launches - 1]), "cuEventElapsedTime");
    result.gpu_span_ns = static_cast<int64_t>(std::llround(static_cast<double>(span_ms) * 1e6));
    if (slots) check(d.cuMemcpyDtoH(host.data(), scratch.ptr, slots * kSlotBytes), "cuMemcpyDtoH(compare slots)");
    for (size_t c = 0; c < result.checked_launches.size(); ++c)
        result.checks.push_back(unpack(host, c * checks.size(), checks.size()));
    return result;
}

std::vector<CheckResult> compare(const ContextPtr& ctx, const std::vector<Check>& checks) {
    const Driver& d = driver();
    ctx->make_current();
    std::vector<uint64_t> host(checks.size() * kSlotWords);
    for (size_t s = 0; s < checks.size(); ++s) init_slot(host.data() + s * kSlotWords);
    if (checks.empty()) return {};
    DeviceScratch scratch(checks.size() * kSlotBytes);
    check(d.cuMemcpyHtoD(scratch.ptr, host.data(), host.size() * 8), "cuMemcpyHtoD(compare slots)");
    for (size_t k = 0; k < checks.size(); ++k) enqueue_check(*ctx, checks[k], scratch.ptr + k * kSlotBytes);
    check(d.cuStreamSynchronize(ctx->stream), "cuStreamSynchronize");
    check(d.cuMemcpyDtoH(host.data(), scratch.ptr, host.size() * 8), "cuMemcpyDtoH(compare slots)");
    return unpack(host, 0, checks.size());
}

}  // namespace mneme

// ------------------------------------------------------------------- batches
namespace mneme {

void ContextState::ensure_gate() {
    if (gate_host) return;
    const Driver& d = driver();
    check(d.cuModuleGetFunction(&wait_flag, compare_module, "mneme_wait_flag"), "cuModuleGetFunction(mneme_wait_flag)");
    void* host = nullptr;
    check(d.cuMemHostAlloc(&host, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc(gate)");
    CUdeviceptr dev = 0;
    CUresult r = d.cuMemHostGetDevicePointer(&dev, host, 0);
    if (r != CUDA_SUCCESS) {
        d.cuMemFreeHost(host);
        check(r, "cuMemHostGetDevicePointer(gate)");
    }
    gate_host = static_cast<volatile uint32_t*>(host);
    *gate_host = 0;
    gate_device = dev;
    gate_value = 0;
}

CUevent ContextState::take_event() {
    {
        std::lock_guard<std::mutex> lock(pool_mutex);
        if (!spare_events.empty()) {
            CUevent e = spare_events.back();
            spare_events.pop_back();
            return e;
        }
    }
    CUevent e = nullptr;
    check(driver().cuEventCreate(&e, CU_EVENT_DEFAULT), "cuEventCreate");
    return e;
}

std::pair<void*, CUdeviceptr> ContextState::take_buffers(size_t bytes) {
    {
        std::lock_guard<std::mutex> lock(pool_mutex);
        for (size_t i = 0; i < spare_buffers.size(); ++i) {
            if (spare_buffers[i].bytes >= bytes) {
                SpareBuffers b = spare_buffers[i];
                spare_buffers.erase(spare_buffers.begin() + static_cast<long>(i));
                return {b.host, b.device};
            }
        }
    }
    const Driver& d = driver();
    bytes = std::max<size_t>(bytes, 4096);
    void* host = nullptr;
    check(d.cuMemHostAlloc(&host, bytes, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc(batch results)");
    CUdeviceptr dev = 0;
    CUresult r = d.cuMemAlloc(&dev, bytes);
    if (r != CUDA_SUCCESS) {
        d.cuMemFreeHost(host);
        check(r, "cuMemAlloc(batch results)");
    }
    std::lock_guard<std::mutex> lock(pool_mutex);
    buffer_sizes[host] = bytes;
    return {host, dev};
}

void ContextState::give_back(void* host, CUdeviceptr device, std::vector<CUevent>& events_used) {
    std::lock_guard<std::mutex> lock(pool_mutex);
    if (host) spare_buffers.push_back({host, device, buffer_sizes[host]});
    spare_events.insert(spare_events.end(), events_used.begin(), events_used.end());
    events_used.clear();
}

void ContextState::give_back_when_done(void* host, CUdeviceptr device, std::vector<CUevent>& events_used) {
    if (events_used.empty()) return give_back(host, device, events_used);
    CUresult r = driver().cuEventQuery(events_used.back());
    if (r == CUDA_SUCCESS) return give_back(host, device, events_used);
    if (r != CUDA_ERROR_NOT_READY) {
        events_used.clear();  // the context is broken: its resources go with it
        return;
    }
    std::lock_guard<std::mutex> lock(pool_mutex);
    pending.push_back({host, device, std::move(events_used)});
    events_used.clear();
}

void ContextState::reclaim() {
    unload_idle_modules();
    std::vector<Pending> done;
    {
        std::lock_guard<std::mutex> lock(pool_mutex);
        if (pending.empty()) return;
        std::vector<Pending> still;
        for (Pending& p : pending) {
            CUresult r = driver().cuEventQuery(p.events.back());
            if (r == CUDA_SUCCESS) done.push_back(std::move(p));
            else if (r == CUDA_ERROR_NOT_READY) still.push_back(std::move(p));
            // else: the context is broken; the resources go with it
        }
        pending.swap(still);
    }
    for (Pending& p : done) give_back(p.host, p.device, p.events);
}

void ContextState::unload_when_idle(CUmodule module) {
    const Driver& d = driver();
    if (d.cuCtxSetCurrent(context) != CUDA_SUCCESS) return;  // the context is gone: the module with it
    CUresult r = d.cuStreamQuery(stream);
    if (r == CUDA_ERROR_NOT_READY) {
        std::lock_guard<std::mutex> lock(pool_mutex);
        idle_unloads.push_back(module);
        return;
    }
    if (r == CUDA_SUCCESS) d.cuModuleUnload(module);
    // else: the context is broken; the module goes with it
}

void ContextState::unload_idle_modules() {
    const Driver& d = driver();
    std::vector<CUmodule> modules;
    {
        std::lock_guard<std::mutex> lock(pool_mutex);
        if (idle_unloads.empty() || d.cuStreamQuery(stream) != CUDA_SUCCESS) return;
        modules.swap(idle_unloads);
    }
    for (CUmodule m : modules) d.cuModuleUnload(m);
}

void ContextState::free_batch_pools() {
    const Driver& d = driver();
    std::lock_guard<std::mutex> lock(pool_mutex);
    // A batch still pending when its context goes (no BatchRun refers to it): freed if the GPU is done
    // with it, else left (freeing memory a kernel still writes, or waiting for a hanging one, is worse).
    for (Pending& p : pending) {
        if (d.cuEventQuery(p.events.back()) != CUDA_SUCCESS) continue;
        spare_events.insert(spare_events.end(), p.events.begin(), p.events.end());
        if (p.host) spare_buffers.push_back({p.host, p.device, 0});
    }
    pending.clear();
    for (CUevent e : spare_events) d.cuEventDestroy(e);
    for (const SpareBuffers& b : spare_buffers) {
        d.cuMemFreeHost(b.host);
        d.cuMemFree(b.device);
    }
    spare_events.clear();
    spare_buffers.clear();
    buffer_sizes.clear();
    if (gate_host) d.cuMemFreeHost(const_cast<uint32_t*>(gate_host));
    gate_host = nullptr;
    gate_device = 0;
}

namespace {

// Opens the gate when it goes out of scope (an exception while enqueueing must not leave the
// GPU waiting for its maximum).
struct Gate {
    ContextState& ctx;
    uint32_t value;
    bool open = false;
    void release() {
        if (open) return;
        std::atomic_thread_fence(std::memory_order_seq_cst);
        *ctx.gate_host = value;
        std::atomic_thread_fence(std::memory_order_seq_cst);
        open = true;
    }
    ~Gate() { release(); }
};

}  // namespace

// What one item's launches need, made once: kernel parameters pointing into its own copy of
// the argument bytes, the launch attributes and configuration, its events and result slots.
struct BatchRun::Prepared {
    std::string args;
    size_t arg_size = 0;
    std::vector<void*> params;
    void* extra[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
    std::vector<CUlaunchAttribute> attrs;
    CUlaunchConfig config{};
    size_t first_event = 0;
    size_t first_slot = 0;
    std::vector<int> checked;
};

BatchRun::BatchRun(ContextPtr ctx_, std::vector<BatchItem> items_, uint64_t gate_max_ns)
    : ctx(std::move(ctx_)), items(std::move(items_)) {
    const Driver& d = driver();
    ContextState& c = *ctx;
    c.make_current();
    prepared.resize(items.size());
    size_t n_events = 0;
    for (size_t k = 0; k < items.size(); ++k) {
        const BatchItem& item = items[k];
        Prepared& p = prepared[k];
        if (!item.function) throw std::invalid_argument("a batch item has no function");
        if (item.function->ctx.get() != &c) throw std::invalid_argument("a batch item's function is of another context");
        if (item.launches < 1) throw std::invalid_argument("launches must be at least 1");
        p.args = item.args;
        p.arg_size = p.args.size();
        for (size_t off : item.spec.param_offsets) {
            if (off >= p.arg_size) throw std::invalid_argument("a parameter offset lies past the argument bytes");
            p.params.push_back(p.args.data() + off);
        }
        p.extra[0] = CU_LAUNCH_PARAM_BUFFER_POINTER;
        p.extra[1] = p.args.data();
        p.extra[2] = CU_LAUNCH_PARAM_BUFFER_SIZE;
        p.extra[3] = &p.arg_size;
        p.extra[4] = CU_LAUNCH_PARAM_END;
        p.attrs.resize(item.spec.attributes.size());
        for (size_t i = 0; i < p.attrs.size(); ++i) {
            const LaunchAttr& a = item.spec.attributes[i];
            if (a.value.size() > sizeof(CUlaunchAttributeValue))
                throw std::invalid_argument("a launch attribute value is longer than CUlaunchAttributeValue");
            std::memset(&p.attrs[i], 0, sizeof(CUlaunchAttribute));
            p.attrs[i].id = static_cast<CUlaunchAttributeID>(a.id);
            std::memcpy(&p.attrs[i].value, a.value.data(), a.value.size());
        }
        CUlaunchConfig& lc = p.config;
        lc.gridDimX = item.grid[0], lc.gridDimY = item.grid[1], lc.gridDimZ = item.grid[2];
        lc.blockDimX = item.block[0], lc.blockDimY = item.block[1], lc.blockDimZ = item.block[2];
        lc.sharedMemBytes = item.shared_mem;
        lc.hStream = c.stream;
        lc.attrs = p.attrs.data();
        lc.numAttrs = static_cast<unsigned>(p.attrs.size());
        for (int i : item.check_launches) {
            if (i < 0 || i >= item.launches) throw std::invalid_argument("check_launches names a launch that does not exist");
            if (!p.checked.empty() && i <= p.checked.back())
                throw std::invalid_argument("check_launches must be sorted and distinct");
            p.checked.push_back(i);
        }
        p.first_event = n_events;
        p.first_slot = slots;
        n_events += 2 * static_cast<size_t>(item.launches);
        slots += p.checked.size() * item.checks.size();
    }
    c.ensure_gate();
    c.reclaim();
    try {
        for (size_t i = 0; i < n_events + 1; ++i) events.push_back(c.take_event());  // the last: all done
        auto buffers = c.take_buffers(std::max<size_t>(slots, 1) * kSlotBytes);
        host = buffers.first;
        device = buffers.second;
    } catch (...) {
        c.give_back(host, device, events);  // nothing was enqueued with them
        host = nullptr;
        throw;
    }
    uint64_t* slot_words = static_cast<uint64_t*>(host);
    for (size_t s = 0; s < slots; ++s) init_slot(slot_words + s * kSlotWords);
    try {
        enqueue(gate_max_ns);
    } catch (...) {
        // Nothing waits for this batch (the gate is open again by now): its buffers and events go back
        // once the stream is done with what was enqueued, which the last event, recorded now, says without
        // waiting; a context that is gone, or a stream that takes no more, keeps them.
        if (!driver_cleanup_abandoned() && d.cuEventRecord(events.back(), c.stream) == CUDA_SUCCESS)
            c.give_back_when_done(host, device, events);
        host = nullptr;
        throw;
    }
}

void BatchRun::enqueue(uint64_t gate_max_ns) {
    const Driver& d = driver();
    ContextState& c = *ctx;
    // In the stream, not synchronous: a batch is enqueued while the one before it runs.
    if (slots) check(d.cuMemcpyHtoDAsync(device, host, slots * kSlotBytes, c.stream), "cuMemcpyHtoDAsync(compare slots)");
    t0 = now_ns();
    Gate gate{c, ++c.gate_value};
    {
        CUdeviceptr flag = c.gate_device;
        unsigned value = gate.value;
        unsigned long long max_ns = gate_max_ns;
        void* params[] = {&flag, &value, &max_ns};
        check(d.cuLaunchKernel(c.wait_flag, 1, 1, 1, 1, 1, 1, 0, c.stream, params, nullptr), "cuLaunchKernel(gate)");
    }
    for (size_t k = 0; k < items.size(); ++k) {
        const BatchItem& item = items[k];
        Prepared& p = prepared[k];
        void** params_ptr = p.params.empty() ? nullptr : p.params.data();
        void** extra_ptr = (p.arg_size && !params_ptr) ? p.extra : nullptr;
        for (const Copy& cp : item.before)
            check(d.cuMemcpyDtoDAsync(cp.dst, cp.src, cp.size, c.stream), "cuMemcpyDtoDAsync(full reset)");
        size_t checked = 0;
        for (int i = 0; i < item.launches; ++i) {
            for (const Copy& cp : item.resets)
                check(d.cuMemcpyDtoDAsync(cp.dst, cp.src, cp.size, c.stream), "cuMemcpyDtoDAsync(reset)");
            for (const ArrayCopy& ac : item.spec.array_resets) copy_array(c, ac, true, c.stream);
            check(d.cuEventRecord(events[p.first_event + 2 * i], c.stream), "cuEventRecord");
            if (p.attrs.empty())
                check(d.cuLaunchKernel(item.function->fn, item.grid[0], item.grid[1], item.grid[2], item.block[0],
                                       item.block[1], item.block[2], item.shared_mem, c.stream, params_ptr,
                                       extra_ptr),
                      "cuLaunchKernel");
            else
                check(d.cuLaunchKernelEx(&p.config, item.function->fn, params_ptr, extra_ptr), "cuLaunchKernelEx");
            check(d.cuEventRecord(events[p.first_event + 2 * i + 1], c.stream), "cuEventRecord");
            if (checked < p.checked.size() && p.checked[checked] == i) {
                for (const ArrayCopy& ac : item.spec.array_readbacks) copy_array(c, ac, false, c.stream);
                for (size_t ch = 0; ch < item.checks.size(); ++ch)
                    enqueue_check(c, item.checks[ch],
                                  device + (p.first_slot + checked * item.checks.size() + ch) * kSlotBytes);
                ++checked;
            }
        }
    }
    // The comparisons' results come back in the stream too, into pinned memory: waiting for this batch
    // then does not wait for the batches enqueued after it.
    if (slots) check(d.cuMemcpyDtoHAsync(host, device, slots * kSlotBytes, c.stream), "cuMemcpyDtoHAsync(compare slots)");
    check(d.cuEventRecord(events.back(), c.stream), "cuEventRecord");
    gate.release();
}

std::vector<RunResult> BatchRun::wait(double timeout_s) {
    const Driver& d = driver();
    ContextState& c = *ctx;
    if (waited) throw std::runtime_error("this batch's results were taken already");
    c.make_current();
    CUevent done = events.back();
    if (timeout_s <= 0) check(d.cuEventSynchronize(done), "cuEventSynchronize");
    else poll_until_done([&] { return d.cuEventQuery(done); }, timeout_s, "cuEventQuery");
    waited = true;
    int64_t wall = now_ns() - t0;
    std::vector<RunResult> results(items.size());
    std::vector<uint64_t> words(slots * kSlotWords);
    if (slots) std::memcpy(words.data(), host, slots * kSlotBytes);
    for (size_t k = 0; k < items.size(); ++k) {
        const BatchItem& item = items[k];
        const Prepared& p = prepared[k];
        RunResult& r = results[k];
        r.checked_launches = p.checked;
        r.wall_ns = wall;
        for (int i = 0; i < item.launches; ++i) {
            float ms = 0;
            check(d.cuEventElapsedTime(&ms, events[p.first_event + 2 * i], events[p.first_event + 2 * i + 1]),
                  "cuEventElapsedTime");
            r.times_ns.push_back(static_cast<int64_t>(std::llround(static_cast<double>(ms) * 1e6)));
        }
        r.event_times_ns = r.times_ns;
        float span_ms = 0;
        check(d.cuEventElapsedTime(&span_ms, events[p.first_event], events[p.first_event + 2 * item.launches - 1]),
              "cuEventElapsedTime");
        r.gpu_span_ns = static_cast<int64_t>(std::llround(static_cast<double>(span_ms) * 1e6));
        size_t n = item.checks.size();
        for (size_t ch = 0; ch < p.checked.size(); ++ch) r.checks.push_back(unpack(words, p.first_slot + ch * n, n));
    }
    c.give_back(host, device, events);
    host = nullptr;
    c.unload_idle_modules();  // (none while another batch runs behind this one)
    return results;
}

bool BatchRun::done() const {
    if (waited || events.empty()) return true;
    ctx->make_current();
    return driver().cuEventQuery(events.back()) != CUDA_ERROR_NOT_READY;
}

BatchRun::~BatchRun() {
    if (host == nullptr || driver_cleanup_abandoned()) return;  // given back, or the context is gone: leave it
    ContextState& c = *ctx;
    // Not waited for (dropped, or wait() failed): its buffers and events are reused only once the GPU
    // is done with them, which is not waited for here (a hanging kernel must not hang whoever drops it).
    if (driver().cuCtxSetCurrent(c.context) == CUDA_SUCCESS) c.give_back_when_done(host, device, events);
}

std::shared_ptr<BatchRun> start_batch(const ContextPtr& ctx, std::vector<BatchItem> items, uint64_t gate_max_ns) {
    if (items.empty()) throw std::invalid_argument("a batch needs at least one item");
    return std::make_shared<BatchRun>(ctx, std::move(items), gate_max_ns);
}

std::vector<RunResult> run_batch(const ContextPtr& ctx, std::vector<BatchItem> items, double timeout_s,
                                 uint64_t gate_max_ns) {
    if (items.empty()) return {};
    return start_batch(ctx, std::move(items), gate_max_ns)->wait(timeout_s);
}

}  // namespace mneme
