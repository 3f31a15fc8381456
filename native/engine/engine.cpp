// The replay engine's device work (see engine.hpp).
#include "engine.hpp"

#include "cupti_timer.hpp"
#include "compare_fatbin.h"  // generated: mneme_compare_fatbin[] (compare_kernels.cu)

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

// Wait for the stream; with a timeout, poll so a hanging kernel cannot block forever.
void wait_stream(const ContextState& ctx, double timeout_s) {
    const Driver& d = driver();
    if (timeout_s <= 0) {
        check(d.cuStreamSynchronize(ctx.stream), "cuStreamSynchronize");
        return;
    }
    int64_t deadline = now_ns() + static_cast<int64_t>(timeout_s * 1e9);
    int spins = 0;
    for (;;) {
        CUresult r = d.cuStreamQuery(ctx.stream);
        if (r == CUDA_SUCCESS) return;
        if (r != CUDA_ERROR_NOT_READY) check(r, "cuStreamQuery");
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
        const Driver& dd = driver();
        dd.cuCtxSetCurrent(keep->context);
        dd.cuModuleUnload(*m);
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
