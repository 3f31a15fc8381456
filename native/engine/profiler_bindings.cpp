// pybind11 bindings of the hardware-counter profiler (profiler.hpp), registered into mneme._engine.
//
// CUPTI errors become mneme._engine.ProfilerError(message, code, name, call): the Python layer
// (mneme.replay.metrics) turns the code into the cause and its fix.
#include "profiler.hpp"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace py = pybind11;

namespace mneme {

void register_profiler(py::module_& m) {
    static py::exception<ProfilerError> profiler_error(m, "ProfilerError");
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const ProfilerError& e) {
            py::object args = py::make_tuple(e.what(), e.code, e.name, e.call);
            PyErr_SetObject(profiler_error.ptr(), args.ptr());
        }
    });

    m.def("profiler_unavailable_reason", &profiler_unavailable_reason,
          "Why hardware counters cannot be collected here ('' when CUPTI's range profiler loads).");
    m.def("profiler_supported_chips", &profiler_supported_chips, "The chips CUPTI's host side knows by name.");
    m.def("profiler_chip_name", &profiler_chip_name, py::arg("device"),
          "The chip of a CUDA device (an ordinal), as CUPTI names it ('GH100').",
          py::call_guard<py::gil_scoped_release>());
    m.def(
        "profiler_device_support",
        [](int device) {
            DeviceSupport s = profiler_device_support(device);
            py::dict out;
            out["overall"] = s.overall, out["architecture"] = s.architecture, out["sli"] = s.sli;
            out["vgpu"] = s.vgpu, out["confidential_compute"] = s.confidential_compute, out["cmp"] = s.cmp;
            out["wsl"] = s.wsl;
            return out;
        },
        py::arg("device"),
        "cuptiProfilerDeviceSupported for the range profiler: each entry 0 unknown, 1 unsupported, 2 disabled, "
        "3 supported.");
    m.def(
        "profiler_counter_availability",
        [](const ContextState& ctx) {
            std::string image;
            {
                py::gil_scoped_release release;
                image = counter_availability(ctx);
            }
            return py::bytes(image);
        },
        py::arg("context"), "The counters the context's GPU offers now (an image for MetricConfig).");
    m.def(
        "profiler_metric_properties",
        [](const std::string& chip, const std::string& metric) {
            MetricProperties p = metric_properties(chip, metric);
            py::dict out;
            out["description"] = p.description, out["hw_unit"] = p.hw_unit, out["dim_unit"] = p.dim_unit;
            out["type"] = p.type;
            return out;
        },
        py::arg("chip"), py::arg("metric"),
        "description, hw_unit, dim_unit and type (0 counter, 1 ratio, 2 throughput) of a metric on a chip; "
        "ProfilerError CUPTI_ERROR_INVALID_METRIC_NAME when the chip has none of that name.");
    m.def("profiler_base_metrics", &base_metrics, py::arg("chip"), py::arg("type"),
          "The chip's base metrics of one type (0 counter, 1 ratio, 2 throughput).");
    m.def("profiler_sub_metrics", &sub_metrics, py::arg("chip"), py::arg("metric"), py::arg("type"),
          "The suffixes (rollups, submetrics) a base metric of that type takes on the chip.");

    py::class_<MetricConfig, std::shared_ptr<MetricConfig>>(m, "MetricConfig")
        .def(py::init([](const std::string& chip, const std::vector<std::string>& metrics, const py::bytes& avail) {
                 return std::make_shared<MetricConfig>(chip, metrics, std::string(avail));
             }),
             py::arg("chip"), py::arg("metrics"), py::arg("counter_availability") = py::bytes(),
             "Schedule `metrics` (raw CUPTI names) on `chip`; ProfilerError names a metric the chip lacks.")
        .def_property_readonly("chip", &MetricConfig::chip)
        .def_property_readonly("metrics", &MetricConfig::metrics)
        .def_property_readonly("passes", &MetricConfig::passes, "Launches the range profiler needs for them.")
        .def_property_readonly("image", [](const MetricConfig& c) { return py::bytes(c.image()); })
        .def(
            "evaluate",
            [](const MetricConfig& c, const py::bytes& counter_data, size_t range) {
                return c.evaluate(std::string(counter_data), range);
            },
            py::arg("counter_data"), py::arg("range") = 0, "The metrics' values in one range of decoded counter data.");

    m.def(
        "profile",
        [](const Function& f, const MetricConfig& config, std::array<unsigned, 3> grid, std::array<unsigned, 3> block,
           unsigned shared_mem, const py::bytes& args,
           const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& resets, uint64_t l2_flush_bytes,
           double timeout_s, const std::vector<std::pair<int, py::bytes>>& attributes,
           const std::vector<size_t>& param_offsets) {
            std::string arg_bytes = args;
            LaunchSpec spec;
            for (const auto& [id, value] : attributes) spec.attributes.push_back({id, std::string(value)});
            spec.param_offsets = param_offsets;
            std::vector<Copy> copies;
            for (const auto& [dst, src, size] : resets) copies.push_back({dst, src, size});
            ProfileResult r;
            {
                py::gil_scoped_release release;
                r = profile_launch(f, config, grid, block, shared_mem, arg_bytes, copies, l2_flush_bytes, timeout_s,
                                   spec);
            }
            py::dict out;
            out["values"] = r.values;
            out["passes"] = r.passes;
            out["ranges_dropped"] = r.ranges_dropped;
            return out;
        },
        py::arg("function"), py::arg("config"), py::arg("grid"), py::arg("block"), py::arg("shared_mem"),
        py::arg("args"), py::arg("resets") = std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>{},
        py::arg("l2_flush_bytes") = 0, py::arg("timeout_s") = 0.0,
        py::arg("attributes") = std::vector<std::pair<int, py::bytes>>{},
        py::arg("param_offsets") = std::vector<size_t>{},
        "Collect config's metrics over one launch of `function` (launched as Function.run launches): per pass "
        "the `resets` copies, a read of l2_flush_bytes of scratch memory, then the launch inside one range, "
        "until CUPTI has every pass. Returns {values (config.metrics order), passes, ranges_dropped}.");
}

}  // namespace mneme
