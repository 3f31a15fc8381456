// Hardware counters of a replayed launch: CUPTI's range profiler (cupti_range_profiler.h) with the
// host-side metric evaluation (cupti_profiler_host.h).
//
// Like the activity timer, libcupti is dlopen()ed on first use (the loader of cupti_timer.cpp): the
// engine builds and imports without it. The host side (metric names, configuration images, the
// number of passes, evaluation) needs no GPU: it works from the chip's name ("GH100"). The target
// side runs one launch per pass, the caller's copies and an L2 flush before each, until CUPTI has
// every pass it needs (user replay, one user range around the launch), then evaluates the metrics.
// No policy: which metrics, which memory to reset, what the values mean is the Python layer's.
#pragma once

#include "engine.hpp"

#include <array>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace mneme {

// A CUPTI profiler call that failed: the call, the CUptiResult, its name and CUPTI's text.
class ProfilerError : public std::runtime_error {
public:
    ProfilerError(const std::string& call, int code, std::string name, const std::string& text)
        : std::runtime_error(call + " failed: " + name + " (" + std::to_string(code) + ")" +
                             (text.empty() || text == name ? "" : ": " + text)),
          code(code), name(std::move(name)), call(call) {}
    int code;
    std::string name;
    std::string call;
};

// Empty when the profiler's entry points load (libcupti of CUDA 12.6 or newer), else why not.
std::string profiler_unavailable_reason();

// The chips the host side knows by name ("GA100", "GH100", ...).
std::vector<std::string> profiler_supported_chips();

// The chip of CUDA device `device` (an ordinal), as the host side names it. Needs the driver.
std::string profiler_chip_name(int device);

// cuptiProfilerDeviceSupported for the range profiler: each field one of CUpti_Profiler_Support_Level
// (0 unknown, 1 unsupported, 2 disabled, 3 supported).
struct DeviceSupport {
    int overall = 0, architecture = 0, sli = 0, vgpu = 0, confidential_compute = 0, cmp = 0, wsl = 0;
};
DeviceSupport profiler_device_support(int device);

// The counters this context's GPU offers now (cuptiProfilerGetCounterAvailability), for the host side.
std::string counter_availability(const ContextState& ctx);

// What the host side says of a metric on a chip; ProfilerError (CUPTI_ERROR_INVALID_METRIC_NAME) when
// the chip has no such metric.
struct MetricProperties {
    std::string description, hw_unit, dim_unit;
    int type = 0;  // CUpti_MetricType: 0 counter, 1 ratio, 2 throughput
};
MetricProperties metric_properties(const std::string& chip, const std::string& metric);

// The chip's base metrics of one CUpti_MetricType, and the submetrics (rollups, suffixes) of a metric.
std::vector<std::string> base_metrics(const std::string& chip, int type);
std::vector<std::string> sub_metrics(const std::string& chip, const std::string& metric, int type);

// A set of metrics on one chip: the configuration image the range profiler schedules them with, the
// number of passes it takes, and the evaluation of collected counter data.
class MetricConfig {
public:
    MetricConfig(std::string chip, std::vector<std::string> metrics, std::string counter_availability = {});
    ~MetricConfig();
    MetricConfig(const MetricConfig&) = delete;
    MetricConfig& operator=(const MetricConfig&) = delete;

    const std::string& chip() const { return chip_; }
    const std::vector<std::string>& metrics() const { return metrics_; }
    const std::string& image() const { return image_; }
    size_t passes() const { return passes_; }
    // The metrics' values in range `range` of decoded counter data, in metrics() order.
    std::vector<double> evaluate(const std::string& counter_data, size_t range = 0) const;

private:
    std::string chip_;
    std::vector<std::string> metrics_;
    std::string availability_;
    std::string image_;
    size_t passes_ = 0;
    void* host_ = nullptr;  // CUpti_Profiler_Host_Object*
};

struct ProfileResult {
    std::vector<double> values;  // in config.metrics() order
    size_t passes = 0;           // launches made (one per pass)
    size_t ranges_dropped = 0;   // ranges CUPTI could not store (0 when all went well)
    std::string counter_data;    // the decoded counter data image
};

// Profile one launch of `f`: for each pass the `resets` copies, then (l2_flush_bytes > 0) a read of
// that many bytes of scratch memory so that the launch finds no lines of earlier work in the L2,
// then the launch inside one range, until CUPTI has every pass `config` needs. timeout_s > 0 bounds
// each pass's wait for the GPU (CudaError LAUNCH_TIMEOUT, the context is given up, as run_launches does).
ProfileResult profile_launch(const Function& f, const MetricConfig& config, std::array<unsigned, 3> grid,
                             std::array<unsigned, 3> block, unsigned shared_mem, const std::string& args,
                             const std::vector<Copy>& resets, uint64_t l2_flush_bytes, double timeout_s,
                             const LaunchSpec& spec = {});

}  // namespace mneme
