// Hardware counters through CUPTI's range profiler (see profiler.hpp).
#include "profiler.hpp"

#include "cupti_timer.hpp"
#include "driver.hpp"

#include <cupti.h>
#include <cupti_profiler_host.h>
#include <cupti_profiler_target.h>
#include <cupti_range_profiler.h>
#include <cupti_target.h>
#include <dlfcn.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

namespace mneme {
namespace {

#define MNEME_PROFILER_FUNCTIONS(X)                  \
    X(cuptiGetResultString)                          \
    X(cuptiProfilerInitialize)                       \
    X(cuptiProfilerDeviceSupported)                  \
    X(cuptiProfilerGetCounterAvailability)           \
    X(cuptiDeviceGetChipName)                        \
    X(cuptiProfilerHostGetSupportedChips)            \
    X(cuptiProfilerHostInitialize)                   \
    X(cuptiProfilerHostDeinitialize)                 \
    X(cuptiProfilerHostGetBaseMetrics)               \
    X(cuptiProfilerHostGetSubMetrics)                \
    X(cuptiProfilerHostGetMetricProperties)          \
    X(cuptiProfilerHostConfigAddMetrics)             \
    X(cuptiProfilerHostGetConfigImageSize)           \
    X(cuptiProfilerHostGetConfigImage)               \
    X(cuptiProfilerHostGetNumOfPasses)               \
    X(cuptiProfilerHostEvaluateToGpuValues)          \
    X(cuptiRangeProfilerEnable)                      \
    X(cuptiRangeProfilerDisable)                     \
    X(cuptiRangeProfilerGetCounterDataSize)          \
    X(cuptiRangeProfilerCounterDataImageInitialize)  \
    X(cuptiRangeProfilerSetConfig)                   \
    X(cuptiRangeProfilerStart)                       \
    X(cuptiRangeProfilerStop)                        \
    X(cuptiRangeProfilerPushRange)                   \
    X(cuptiRangeProfilerPopRange)                    \
    X(cuptiRangeProfilerDecodeData)                  \
    X(cuptiRangeProfilerGetCounterDataInfo)

struct Profiler {
#define MNEME_DECLARE(name) decltype(&::name) name = nullptr;
    MNEME_PROFILER_FUNCTIONS(MNEME_DECLARE)
#undef MNEME_DECLARE
    std::string reason;  // empty when usable
    bool initialized = false;
};

// libnvperf_host and libnvperf_target ship beside libcupti, which loads them when the host side first
// needs them; loading them here first from libcupti's own folder makes that independent of the
// library path.
void preload_perfworks(void* cupti, void* symbol) {
    Dl_info info{};
    if (!cupti || !symbol || !dladdr(symbol, &info) || !info.dli_fname) return;
    std::string path = info.dli_fname;
    size_t slash = path.rfind('/');
    if (slash == std::string::npos) return;
    for (const char* lib : {"libnvperf_host.so", "libnvperf_target.so"})
        dlopen((path.substr(0, slash + 1) + lib).c_str(), RTLD_NOW | RTLD_GLOBAL);  // optional: CUPTI says when missing
}

Profiler load() {
    Profiler p;
    void* h = cupti_library();
    if (!h) {
        p.reason = "libcupti not found (set MNEME_CUPTI_LIB, or CUDA_HOME to a toolkit that has it)";
        return p;
    }
    std::string missing;
#define MNEME_RESOLVE(name)                                                        \
    p.name = reinterpret_cast<decltype(p.name)>(dlsym(h, #name));                  \
    if (!p.name) missing += std::string(missing.empty() ? "" : ", ") + #name;
    MNEME_PROFILER_FUNCTIONS(MNEME_RESOLVE)
#undef MNEME_RESOLVE
    if (!missing.empty()) {
        p.reason = "libcupti lacks the range profiler's entry points (" + missing +
                   "): hardware counters need CUPTI from CUDA 12.6 or newer";
        return p;
    }
    preload_perfworks(h, reinterpret_cast<void*>(p.cuptiProfilerHostInitialize));
    return p;
}

std::mutex g_lock;  // CUPTI's profiler objects are used by one thread at a time

Profiler& profiler() {
    static Profiler* instance = new Profiler(load());  // lives as long as the process
    return *instance;
}

Profiler& usable() {
    Profiler& p = profiler();
    if (!p.reason.empty()) throw std::runtime_error("hardware counters are not available: " + p.reason);
    return p;
}

const char* result_name(CUptiResult r) {
    switch (r) {
#define MNEME_NAME(x) case x: return #x;
        MNEME_NAME(CUPTI_ERROR_INVALID_PARAMETER)
        MNEME_NAME(CUPTI_ERROR_INVALID_DEVICE)
        MNEME_NAME(CUPTI_ERROR_INVALID_CONTEXT)
        MNEME_NAME(CUPTI_ERROR_INVALID_OPERATION)
        MNEME_NAME(CUPTI_ERROR_OUT_OF_MEMORY)
        MNEME_NAME(CUPTI_ERROR_HARDWARE)
        MNEME_NAME(CUPTI_ERROR_NOT_INITIALIZED)
        MNEME_NAME(CUPTI_ERROR_INVALID_METRIC_NAME)
        MNEME_NAME(CUPTI_ERROR_DISABLED)
        MNEME_NAME(CUPTI_ERROR_HARDWARE_BUSY)
        MNEME_NAME(CUPTI_ERROR_NOT_SUPPORTED)
        MNEME_NAME(CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED)
        MNEME_NAME(CUPTI_ERROR_INSUFFICIENT_PRIVILEGES)
        MNEME_NAME(CUPTI_ERROR_OLD_PROFILER_API_INITIALIZED)
        MNEME_NAME(CUPTI_ERROR_LEGACY_PROFILER_NOT_SUPPORTED)
        MNEME_NAME(CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
        MNEME_NAME(CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES)
        MNEME_NAME(CUPTI_ERROR_CONFIDENTIAL_COMPUTING_NOT_SUPPORTED)
        MNEME_NAME(CUPTI_ERROR_CMP_DEVICE_NOT_SUPPORTED)
        MNEME_NAME(CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED)
        MNEME_NAME(CUPTI_ERROR_SLI_DEVICE_NOT_SUPPORTED)
        MNEME_NAME(CUPTI_ERROR_WSL_DEVICE_NOT_SUPPORTED)
        MNEME_NAME(CUPTI_ERROR_INVALID_CHIP_NAME)
        MNEME_NAME(CUPTI_ERROR_UNKNOWN)
#undef MNEME_NAME
        default: return "CUPTI_ERROR";
    }
}

void check(CUptiResult r, const std::string& call) {
    if (r == CUPTI_SUCCESS) return;
    const char* text = nullptr;
    profiler().cuptiGetResultString(r, &text);
    throw ProfilerError(call, static_cast<int>(r), result_name(r), text ? text : "");
}

// cuptiProfilerInitialize, once per process, before any target-side call. Its result is not checked, as
// CUPTI's range profiling sample does not: where profiling cannot run, the calls after it say why.
void initialize(Profiler& p) {
    if (p.initialized) return;
    CUpti_Profiler_Initialize_Params params{CUpti_Profiler_Initialize_Params_STRUCT_SIZE};
    p.cuptiProfilerInitialize(&params);
    p.initialized = true;
}

// A host object of a chip, released when it goes out of scope.
struct Host {
    CUpti_Profiler_Host_Object* object = nullptr;
    Host(Profiler& p, const std::string& chip, const std::string& availability) {
        CUpti_Profiler_Host_Initialize_Params params{CUpti_Profiler_Host_Initialize_Params_STRUCT_SIZE};
        params.profilerType = CUPTI_PROFILER_TYPE_RANGE_PROFILER;
        params.pChipName = chip.c_str();
        params.pCounterAvailabilityImage =
            availability.empty() ? nullptr : reinterpret_cast<const uint8_t*>(availability.data());
        check(p.cuptiProfilerHostInitialize(&params), "cuptiProfilerHostInitialize(" + chip + ")");
        object = params.pHostObject;
    }
    ~Host() { release(profiler(), object); }
    Host(const Host&) = delete;
    Host& operator=(const Host&) = delete;
    CUpti_Profiler_Host_Object* take() {
        auto* o = object;
        object = nullptr;
        return o;
    }
    static void release(Profiler& p, CUpti_Profiler_Host_Object* o) {
        if (!o) return;
        CUpti_Profiler_Host_Deinitialize_Params params{CUpti_Profiler_Host_Deinitialize_Params_STRUCT_SIZE};
        params.pHostObject = o;
        p.cuptiProfilerHostDeinitialize(&params);
    }
};

std::vector<std::string> strings(const char* const* names, size_t n) {
    std::vector<std::string> out;
    for (size_t i = 0; i < n; ++i)
        if (names[i]) out.emplace_back(names[i]);
    return out;
}

std::vector<const char*> pointers(const std::vector<std::string>& names) {
    std::vector<const char*> out;
    for (const auto& n : names) out.push_back(n.c_str());
    return out;
}

// `query(profiler, host object)` on a fresh host object of `chip` (no counter availability: names only).
template <class Query>
auto on_host(const std::string& chip, Query&& query) {
    std::lock_guard<std::mutex> hold(g_lock);
    Profiler& p = usable();
    Host host(p, chip, {});
    return query(p, host.object);
}

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Wait for the context's stream; with a timeout, the context is given up when the kernel still runs.
void wait_for_stream(const ContextState& ctx, double timeout_s) {
    const Driver& d = driver();
    int64_t deadline = now_ns() + static_cast<int64_t>(timeout_s * 1e9);
    for (CUresult r; (r = d.cuStreamQuery(ctx.stream)) != CUDA_SUCCESS;) {
        if (r != CUDA_ERROR_NOT_READY) mneme::check(r, "cuStreamQuery");
        if (timeout_s > 0 && now_ns() > deadline) {
            abandon_driver_cleanup();
            throw CudaError(CUDA_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT",
                            "waiting for the profiled kernel (timeout " + std::to_string(timeout_s) + " s)");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
}

// One launch of `f` on the context's stream, as run_launches makes it: kernelParams into the argument
// bytes where the layout is known, else the bytes through `extra`; cuLaunchKernelEx with attributes.
class Launch {
public:
    Launch(const Function& f, std::array<unsigned, 3> grid, std::array<unsigned, 3> block, unsigned shared_mem,
           const std::string& args, const LaunchSpec& spec)
        : f_(f), args_(args), size_(args_.size()) {
        for (size_t off : spec.param_offsets) {
            if (off >= size_) throw std::invalid_argument("a parameter offset lies past the argument bytes");
            params_.push_back(args_.data() + off);
        }
        for (const LaunchAttr& a : spec.attributes) {
            if (a.value.size() > sizeof(CUlaunchAttributeValue))
                throw std::invalid_argument("a launch attribute value is longer than CUlaunchAttributeValue");
            CUlaunchAttribute attr;
            std::memset(&attr, 0, sizeof(attr));
            attr.id = static_cast<CUlaunchAttributeID>(a.id);
            std::memcpy(&attr.value, a.value.data(), a.value.size());
            attrs_.push_back(attr);
        }
        config_.gridDimX = grid[0], config_.gridDimY = grid[1], config_.gridDimZ = grid[2];
        config_.blockDimX = block[0], config_.blockDimY = block[1], config_.blockDimZ = block[2];
        config_.sharedMemBytes = shared_mem;
        config_.hStream = f.ctx->stream;
        config_.attrs = attrs_.data();
        config_.numAttrs = static_cast<unsigned>(attrs_.size());
    }
    void operator()() {
        void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, args_.data(), CU_LAUNCH_PARAM_BUFFER_SIZE, &size_,
                         CU_LAUNCH_PARAM_END};
        void** params = params_.empty() ? nullptr : params_.data();
        void** extra_ptr = (size_ && !params) ? extra : nullptr;
        mneme::check(driver().cuLaunchKernelEx(&config_, f_.fn, params, extra_ptr), "cuLaunchKernelEx(profiled)");
    }

private:
    const Function& f_;
    std::string args_;
    size_t size_;
    std::vector<void*> params_;
    std::vector<CUlaunchAttribute> attrs_;
    CUlaunchConfig config_{};
};

// The range profiler enabled on a context, disabled when it goes out of scope.
struct RangeProfiler {
    Profiler& p;
    CUpti_RangeProfiler_Object* object = nullptr;
    RangeProfiler(Profiler& p_, CUcontext context) : p(p_) {
        CUpti_RangeProfiler_Enable_Params params{CUpti_RangeProfiler_Enable_Params_STRUCT_SIZE};
        params.ctx = context;
        check(p.cuptiRangeProfilerEnable(&params), "cuptiRangeProfilerEnable");
        object = params.pRangeProfilerObject;
    }
    ~RangeProfiler() {
        if (!object || driver_cleanup_abandoned()) return;
        CUpti_RangeProfiler_Disable_Params params{CUpti_RangeProfiler_Disable_Params_STRUCT_SIZE};
        params.pRangeProfilerObject = object;
        p.cuptiRangeProfilerDisable(&params);
    }
    RangeProfiler(const RangeProfiler&) = delete;
    RangeProfiler& operator=(const RangeProfiler&) = delete;

    std::string counter_data(const std::vector<std::string>& metrics) {
        std::vector<const char*> names = pointers(metrics);
        CUpti_RangeProfiler_GetCounterDataSize_Params size{CUpti_RangeProfiler_GetCounterDataSize_Params_STRUCT_SIZE};
        size.pRangeProfilerObject = object;
        size.pMetricNames = names.data();
        size.numMetrics = names.size();
        size.maxNumOfRanges = 1;
        size.maxNumRangeTreeNodes = 1;
        check(p.cuptiRangeProfilerGetCounterDataSize(&size), "cuptiRangeProfilerGetCounterDataSize");
        std::string image(size.counterDataSize, '\0');
        CUpti_RangeProfiler_CounterDataImage_Initialize_Params init{
            CUpti_RangeProfiler_CounterDataImage_Initialize_Params_STRUCT_SIZE};
        init.pRangeProfilerObject = object;
        init.counterDataSize = image.size();
        init.pCounterData = reinterpret_cast<uint8_t*>(image.data());
        check(p.cuptiRangeProfilerCounterDataImageInitialize(&init), "cuptiRangeProfilerCounterDataImageInitialize");
        return image;
    }
};

}  // namespace

std::string profiler_unavailable_reason() { return profiler().reason; }

std::vector<std::string> profiler_supported_chips() {
    std::lock_guard<std::mutex> hold(g_lock);
    Profiler& p = usable();
    CUpti_Profiler_Host_GetSupportedChips_Params params{CUpti_Profiler_Host_GetSupportedChips_Params_STRUCT_SIZE};
    check(p.cuptiProfilerHostGetSupportedChips(&params), "cuptiProfilerHostGetSupportedChips");
    return strings(params.ppChipNames, params.numChips);
}

std::string profiler_chip_name(int device) {
    std::lock_guard<std::mutex> hold(g_lock);
    Profiler& p = usable();
    driver();  // the driver first: DriverUnavailable says why there is no device
    initialize(p);
    CUpti_Device_GetChipName_Params params{CUpti_Device_GetChipName_Params_STRUCT_SIZE};
    params.deviceIndex = static_cast<size_t>(device);
    check(p.cuptiDeviceGetChipName(&params), "cuptiDeviceGetChipName");
    return params.pChipName ? params.pChipName : "";
}

DeviceSupport profiler_device_support(int device) {
    std::lock_guard<std::mutex> hold(g_lock);
    Profiler& p = usable();
    CUdevice dev = 0;
    mneme::check(driver().cuDeviceGet(&dev, device), "cuDeviceGet");
    initialize(p);
    CUpti_Profiler_DeviceSupported_Params params{CUpti_Profiler_DeviceSupported_Params_STRUCT_SIZE};
    params.cuDevice = dev;
    params.api = CUPTI_PROFILER_RANGE_PROFILING;
    check(p.cuptiProfilerDeviceSupported(&params), "cuptiProfilerDeviceSupported");
    DeviceSupport s;
    s.overall = params.isSupported, s.architecture = params.architecture, s.sli = params.sli;
    s.vgpu = params.vGpu, s.confidential_compute = params.confidentialCompute, s.cmp = params.cmp;
    s.wsl = params.wsl;
    return s;
}

std::string counter_availability(const ContextState& ctx) {
    std::lock_guard<std::mutex> hold(g_lock);
    Profiler& p = usable();
    ctx.make_current();
    initialize(p);
    CUpti_Profiler_GetCounterAvailability_Params params{CUpti_Profiler_GetCounterAvailability_Params_STRUCT_SIZE};
    params.ctx = ctx.context;
    check(p.cuptiProfilerGetCounterAvailability(&params), "cuptiProfilerGetCounterAvailability");
    std::string image(params.counterAvailabilityImageSize, '\0');
    params.pCounterAvailabilityImage = reinterpret_cast<uint8_t*>(image.data());
    check(p.cuptiProfilerGetCounterAvailability(&params), "cuptiProfilerGetCounterAvailability");
    image.resize(params.counterAvailabilityImageSize);
    return image;
}

MetricProperties metric_properties(const std::string& chip, const std::string& metric) {
    return on_host(chip, [&](Profiler& p, CUpti_Profiler_Host_Object* host) {
        CUpti_Profiler_Host_GetMetricProperties_Params params{
            CUpti_Profiler_Host_GetMetricProperties_Params_STRUCT_SIZE};
        params.pHostObject = host;
        params.pMetricName = metric.c_str();
        check(p.cuptiProfilerHostGetMetricProperties(&params), "cuptiProfilerHostGetMetricProperties(" + metric + ")");
        MetricProperties out;
        out.description = params.pDescription ? params.pDescription : "";
        out.hw_unit = params.pHwUnit ? params.pHwUnit : "";
        out.dim_unit = params.pDimUnit ? params.pDimUnit : "";
        out.type = static_cast<int>(params.metricType);
        return out;
    });
}

std::vector<std::string> base_metrics(const std::string& chip, int type) {
    return on_host(chip, [&](Profiler& p, CUpti_Profiler_Host_Object* host) {
        CUpti_Profiler_Host_GetBaseMetrics_Params params{CUpti_Profiler_Host_GetBaseMetrics_Params_STRUCT_SIZE};
        params.pHostObject = host;
        params.metricType = static_cast<CUpti_MetricType>(type);
        check(p.cuptiProfilerHostGetBaseMetrics(&params), "cuptiProfilerHostGetBaseMetrics");
        return strings(params.ppMetricNames, params.numMetrics);
    });
}

std::vector<std::string> sub_metrics(const std::string& chip, const std::string& metric, int type) {
    return on_host(chip, [&](Profiler& p, CUpti_Profiler_Host_Object* host) {
        CUpti_Profiler_Host_GetSubMetrics_Params params{CUpti_Profiler_Host_GetSubMetrics_Params_STRUCT_SIZE};
        params.pHostObject = host;
        params.metricType = static_cast<CUpti_MetricType>(type);
        params.pMetricName = metric.c_str();
        check(p.cuptiProfilerHostGetSubMetrics(&params), "cuptiProfilerHostGetSubMetrics(" + metric + ")");
        return strings(params.ppSubMetrics, params.numOfSubmetrics);
    });
}

// ----------------------------------------------------------------------------------- MetricConfig
MetricConfig::MetricConfig(std::string chip, std::vector<std::string> metrics, std::string availability)
    : chip_(std::move(chip)), metrics_(std::move(metrics)), availability_(std::move(availability)) {
    if (metrics_.empty()) throw std::invalid_argument("a metric configuration needs at least one metric");
    std::lock_guard<std::mutex> hold(g_lock);
    Profiler& p = usable();
    Host host(p, chip_, availability_);
    std::vector<const char*> names = pointers(metrics_);
    for (size_t i = 0; i < names.size(); ++i) {  // one at a time: an error names the metric
        CUpti_Profiler_Host_ConfigAddMetrics_Params add{CUpti_Profiler_Host_ConfigAddMetrics_Params_STRUCT_SIZE};
        add.pHostObject = host.object;
        add.ppMetricNames = &names[i];
        add.numMetrics = 1;
        check(p.cuptiProfilerHostConfigAddMetrics(&add), "cuptiProfilerHostConfigAddMetrics(" + metrics_[i] + ")");
    }
    CUpti_Profiler_Host_GetConfigImageSize_Params size{CUpti_Profiler_Host_GetConfigImageSize_Params_STRUCT_SIZE};
    size.pHostObject = host.object;
    check(p.cuptiProfilerHostGetConfigImageSize(&size), "cuptiProfilerHostGetConfigImageSize");
    image_.assign(size.configImageSize, '\0');
    CUpti_Profiler_Host_GetConfigImage_Params get{CUpti_Profiler_Host_GetConfigImage_Params_STRUCT_SIZE};
    get.pHostObject = host.object;
    get.configImageSize = image_.size();
    get.pConfigImage = reinterpret_cast<uint8_t*>(image_.data());
    check(p.cuptiProfilerHostGetConfigImage(&get), "cuptiProfilerHostGetConfigImage");
    CUpti_Profiler_Host_GetNumOfPasses_Params passes{CUpti_Profiler_Host_GetNumOfPasses_Params_STRUCT_SIZE};
    passes.configImageSize = image_.size();
    passes.pConfigImage = reinterpret_cast<uint8_t*>(image_.data());
    check(p.cuptiProfilerHostGetNumOfPasses(&passes), "cuptiProfilerHostGetNumOfPasses");
    passes_ = passes.numOfPasses;
    host_ = host.take();
}

MetricConfig::~MetricConfig() {
    std::lock_guard<std::mutex> hold(g_lock);
    Host::release(profiler(), static_cast<CUpti_Profiler_Host_Object*>(host_));
}

std::vector<double> MetricConfig::evaluate(const std::string& counter_data, size_t range) const {
    std::lock_guard<std::mutex> hold(g_lock);
    Profiler& p = usable();
    CUpti_RangeProfiler_GetCounterDataInfo_Params info{CUpti_RangeProfiler_GetCounterDataInfo_Params_STRUCT_SIZE};
    info.pCounterDataImage = reinterpret_cast<const uint8_t*>(counter_data.data());
    info.counterDataImageSize = counter_data.size();
    check(p.cuptiRangeProfilerGetCounterDataInfo(&info), "cuptiRangeProfilerGetCounterDataInfo");
    if (range >= info.numTotalRanges)
        throw std::runtime_error("the counter data holds " + std::to_string(info.numTotalRanges) +
                                 " range(s): the profiled launch was not collected");
    std::vector<const char*> names = pointers(metrics_);
    std::vector<double> values(names.size(), 0.0);
    CUpti_Profiler_Host_EvaluateToGpuValues_Params eval{CUpti_Profiler_Host_EvaluateToGpuValues_Params_STRUCT_SIZE};
    eval.pHostObject = static_cast<CUpti_Profiler_Host_Object*>(host_);
    eval.pCounterDataImage = reinterpret_cast<const uint8_t*>(counter_data.data());
    eval.counterDataImageSize = counter_data.size();
    eval.rangeIndex = range;
    eval.ppMetricNames = names.data();
    eval.numMetrics = names.size();
    eval.pMetricValues = values.data();
    check(p.cuptiProfilerHostEvaluateToGpuValues(&eval), "cuptiProfilerHostEvaluateToGpuValues");
    return values;
}

// ---------------------------------------------------------------------------------- the passes
ProfileResult profile_launch(const Function& f, const MetricConfig& config, std::array<unsigned, 3> grid,
                             std::array<unsigned, 3> block, unsigned shared_mem, const std::string& args,
                             const std::vector<Copy>& resets, uint64_t l2_flush_bytes, double timeout_s,
                             const LaunchSpec& spec) {
    const Driver& d = driver();
    ContextState& ctx = *f.ctx;
    ctx.make_current();
    Launch launch(f, grid, block, shared_mem, args, spec);
    if (l2_flush_bytes) ctx.ensure_scrub(l2_flush_bytes);
    unsigned long long flush_words = l2_flush_bytes / 16;
    CUdeviceptr flush_ptr = ctx.scrub_buffer, flush_sink = ctx.scrub_buffer + ctx.scrub_bytes;
    void* flush_params[] = {&flush_ptr, &flush_words, &flush_sink};

    ProfileResult out;
    {
        std::lock_guard<std::mutex> hold(g_lock);
        Profiler& p = usable();
        initialize(p);
        RangeProfiler rp(p, ctx.context);
        out.counter_data = rp.counter_data(config.metrics());
        CUpti_RangeProfiler_SetConfig_Params set{CUpti_RangeProfiler_SetConfig_Params_STRUCT_SIZE};
        set.pRangeProfilerObject = rp.object;
        set.configSize = config.image().size();
        set.pConfig = reinterpret_cast<const uint8_t*>(config.image().data());
        set.counterDataImageSize = out.counter_data.size();
        set.pCounterDataImage = reinterpret_cast<uint8_t*>(out.counter_data.data());
        set.range = CUPTI_UserRange;
        set.replayMode = CUPTI_UserReplay;
        set.maxRangesPerPass = 1;
        set.numNestingLevels = 1;
        set.minNestingLevel = 1;
        set.passIndex = 0;
        set.targetNestingLevel = 1;
        check(p.cuptiRangeProfilerSetConfig(&set), "cuptiRangeProfilerSetConfig");
        const size_t most = config.passes() + 1;  // CUPTI says when it has all: never loop forever
        for (bool submitted = false; !submitted;) {
            if (out.passes == most)
                throw std::runtime_error("the range profiler wanted more than the " + std::to_string(config.passes()) +
                                         " passes its configuration has");
            // Outside the range: the copies that restore the memory, the flush, and their end.
            for (const Copy& c : resets)
                mneme::check(d.cuMemcpyDtoDAsync(c.dst, c.src, c.size, ctx.stream), "cuMemcpyDtoDAsync(reset)");
            if (flush_words)
                mneme::check(d.cuLaunchKernel(ctx.l2_scrub, static_cast<unsigned>(ctx.sm_count * 4), 1, 1, 256, 1, 1,
                                              0, ctx.stream, flush_params, nullptr),
                             "cuLaunchKernel(L2 flush)");
            wait_for_stream(ctx, timeout_s);
            CUpti_RangeProfiler_Start_Params start{CUpti_RangeProfiler_Start_Params_STRUCT_SIZE};
            start.pRangeProfilerObject = rp.object;
            check(p.cuptiRangeProfilerStart(&start), "cuptiRangeProfilerStart");
            CUpti_RangeProfiler_PushRange_Params push{CUpti_RangeProfiler_PushRange_Params_STRUCT_SIZE};
            push.pRangeProfilerObject = rp.object;
            push.pRangeName = "mneme";
            check(p.cuptiRangeProfilerPushRange(&push), "cuptiRangeProfilerPushRange");
            launch();
            CUpti_RangeProfiler_PopRange_Params pop{CUpti_RangeProfiler_PopRange_Params_STRUCT_SIZE};
            pop.pRangeProfilerObject = rp.object;
            check(p.cuptiRangeProfilerPopRange(&pop), "cuptiRangeProfilerPopRange");
            CUpti_RangeProfiler_Stop_Params stop{CUpti_RangeProfiler_Stop_Params_STRUCT_SIZE};
            stop.pRangeProfilerObject = rp.object;
            check(p.cuptiRangeProfilerStop(&stop), "cuptiRangeProfilerStop");
            wait_for_stream(ctx, timeout_s);
            submitted = stop.isAllPassSubmitted != 0;
            ++out.passes;
        }
        CUpti_RangeProfiler_DecodeData_Params decode{CUpti_RangeProfiler_DecodeData_Params_STRUCT_SIZE};
        decode.pRangeProfilerObject = rp.object;
        check(p.cuptiRangeProfilerDecodeData(&decode), "cuptiRangeProfilerDecodeData");
        out.ranges_dropped = decode.numOfRangeDropped;
    }
    out.values = config.evaluate(out.counter_data);
    return out;
}

}  // namespace mneme
