// pybind11 bindings of the replay engine: mneme._engine.
//
// The Python surface mirrors engine.hpp one to one; device addresses are plain
// ints, byte strings and buffer-protocol objects carry data. Driver errors
// become mneme._engine.CudaError(message, code, name) so the Python layer can
// tell a bad launch from a fault that destroyed the context.
#include "cupti_timer.hpp"
#include "engine.hpp"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

namespace py = pybind11;
using namespace mneme;

namespace mneme {
void register_profiler(py::module_& m);  // profiler_bindings.cpp: hardware counters
}

namespace {

// Device memory owned by Python: freed when the object goes or on free().
class Buffer {
public:
    Buffer(ContextPtr ctx, uint64_t size) : ctx_(std::move(ctx)), size_(size) {
        ctx_->make_current();
        check(driver().cuMemAlloc(&ptr_, size ? size : 1), "cuMemAlloc");
    }
    ~Buffer() { free(); }
    void free() {
        if (!ptr_ || driver_cleanup_abandoned()) return;
        driver().cuCtxSetCurrent(ctx_->context);
        driver().cuMemFree(ptr_);
        ptr_ = 0;
    }
    uint64_t ptr() const {
        if (!ptr_) throw std::runtime_error("the device buffer was freed");
        return ptr_;
    }
    uint64_t size() const { return size_; }

private:
    ContextPtr ctx_;
    CUdeviceptr ptr_ = 0;
    uint64_t size_;
};

py::buffer_info contiguous(const py::buffer& data) {
    py::buffer_info info = data.request();
    bool c_contiguous = info.ndim <= 1 ? (info.ndim == 0 || info.strides[0] == info.itemsize) : false;
    if (!c_contiguous) throw std::invalid_argument("expected a contiguous one-dimensional buffer");
    return info;
}

Check make_check(const py::tuple& t) {
    if (t.size() != 6 && t.size() != 7)
        throw std::invalid_argument("a check is (actual, expected, size, dtype, mode, threshold[, hash_elem])");
    Check c;
    c.actual = t[0].cast<uint64_t>();
    c.expected = t[1].cast<uint64_t>();
    c.size = t[2].cast<uint64_t>();
    c.dtype = t[3].cast<int>();
    c.mode = py::isinstance<py::bool_>(t[4]) ? (t[4].cast<bool>() ? 1 : 0) : t[4].cast<int>();  // bool: relative
    c.threshold = t[5].cast<double>();
    c.hash_elem = t.size() == 7 ? t[6].cast<unsigned>() : 0;
    if (c.mode < 0 || c.mode > 2) throw std::invalid_argument("a check's mode is 0 (absolute), 1 (relative) or 2 (ulp)");
    if (c.dtype >= 0 && c.size % dtype_size(c.dtype) != 0)
        throw std::invalid_argument("a typed check's size must be a multiple of its element size");
    if (c.hash_elem && ((c.hash_elem & (c.hash_elem - 1)) || c.hash_elem > 8 || c.size % c.hash_elem))
        throw std::invalid_argument("hash_elem must be 1, 2, 4 or 8 and divide the check's size");
    return c;
}

// (stats[7], counters[11]): the 5 counters, then the 6 hashes (zero unless hash_elem was given).
py::tuple check_result(const CheckResult& r) {
    py::tuple stats(7), counters(11);
    for (size_t i = 0; i < 7; ++i) stats[i] = r.stats[i];
    for (size_t i = 0; i < 5; ++i) counters[i] = r.counters[i];
    for (size_t i = 0; i < 6; ++i) counters[5 + i] = r.hashes[i];
    return py::make_tuple(stats, counters);
}

}  // namespace

PYBIND11_MODULE(_engine, m) {
    m.doc() = "mneme's native replay engine: device windows, modules, timed launches, device compares";

    static py::exception<CudaError> cuda_error(m, "CudaError");
    static py::exception<DriverUnavailable> unavailable(m, "DriverUnavailable");
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const CudaError& e) {
            py::object args = py::make_tuple(e.what(), static_cast<int>(e.code), e.name);
            PyErr_SetObject(cuda_error.ptr(), args.ptr());
        } catch (const DriverUnavailable& e) {
            PyErr_SetString(unavailable.ptr(), e.what());
        }
    });

    // Loading and initialising the driver takes 0.1-0.2 s: without the GIL, so a worker's
    // imports (EngineSpec.warm_up) run beside it.
    m.def("driver_available", [] { return driver_unavailable_reason().empty(); },
          "True when libcuda.so.1 loads, initialises and sees a GPU.", py::call_guard<py::gil_scoped_release>());
    m.def("driver_unavailable_reason", &driver_unavailable_reason,
          "Why the driver cannot be used ('' when it can).", py::call_guard<py::gil_scoped_release>());
    m.def("driver_version", [] { return driver().version; }, "The driver's CUDA version, e.g. 13000.");
    m.def("device_count", [] {
        int n = 0;
        check(driver().cuDeviceGetCount(&n), "cuDeviceGetCount");
        return n;
    });
    m.def("dtype_size", &dtype_size);
    m.def("cupti_unavailable_reason", &cupti_unavailable_reason,
          "Why CUPTI activity timing cannot be used here ('' when it can).");
    m.def("abandon_cleanup", &abandon_driver_cleanup,
          "The context is lost: from now on the engine's destructors leave the driver alone.");

    py::class_<Buffer, std::shared_ptr<Buffer>>(m, "Buffer")
        .def_property_readonly("ptr", &Buffer::ptr)
        .def_property_readonly("size", &Buffer::size)
        .def("free", &Buffer::free);

    py::class_<ContextState, ContextPtr>(m, "Context")
        .def(py::init<int>(), py::arg("device") = 0, py::call_guard<py::gil_scoped_release>())  // cuCtxCreate
        .def_readonly("device", &ContextState::ordinal)
        .def_readonly("sm_count", &ContextState::sm_count)
        .def_property_readonly("name",
                               [](const ContextState& c) {
                                   char name[256] = {0};
                                   check(driver().cuDeviceGetName(name, sizeof(name) - 1, c.device),
                                         "cuDeviceGetName");
                                   return std::string(name);
                               })
        .def_property_readonly("compute_capability",
                               [](const ContextState& c) {
                                   int major = 0, minor = 0;
                                   check(driver().cuDeviceGetAttribute(
                                             &major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, c.device),
                                         "cuDeviceGetAttribute");
                                   check(driver().cuDeviceGetAttribute(
                                             &minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, c.device),
                                         "cuDeviceGetAttribute");
                                   return py::make_tuple(major, minor);
                               })
        .def_property_readonly("l2_cache_size",
                               [](const ContextState& c) {
                                   int v = 0;
                                   check(driver().cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, c.device),
                                         "cuDeviceGetAttribute(L2_CACHE_SIZE)");
                                   return v;
                               })
        .def("attribute",
             [](const ContextState& c, int attr) {
                 int v = 0;
                 check(driver().cuDeviceGetAttribute(&v, static_cast<CUdevice_attribute>(attr), c.device),
                       "cuDeviceGetAttribute");
                 return v;
             })
        .def("mem_info",
             [](const ContextState& c) {
                 c.make_current();
                 size_t free_b = 0, total = 0;
                 check(driver().cuMemGetInfo(&free_b, &total), "cuMemGetInfo");
                 return py::make_tuple(free_b, total);
             })
        .def("allocation_granularity",
             [](const ContextState& c) {
                 CUmemAllocationProp prop{};
                 prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
                 prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
                 prop.location.id = c.device;
                 size_t gran = 0;
                 check(driver().cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                       "cuMemGetAllocationGranularity");
                 return gran;
             },
             "The granularity (bytes) of reservations and mappings.")
        .def("alloc", [](const ContextPtr& c, uint64_t size) { return std::make_shared<Buffer>(c, size); })
        .def("reserve",
             [](const ContextPtr& c, uint64_t base, uint64_t size) {
                 return std::make_shared<Reservation>(c, base, size);
             },
             "Reserve [base, base+size) at exactly base; fails when the range is taken.")
        .def("upload",
             [](const ContextState& c, uint64_t dst, const py::buffer& data) {
                 py::buffer_info info = contiguous(data);
                 size_t bytes = static_cast<size_t>(info.size * info.itemsize);
                 if (!bytes) return;
                 c.make_current();
                 py::gil_scoped_release release;
                 check(driver().cuMemcpyHtoD(dst, info.ptr, bytes), "cuMemcpyHtoD");
             })
        .def("download",
             [](const ContextState& c, uint64_t src, uint64_t size) {
                 std::string out(size, '\0');
                 if (size) {
                     c.make_current();
                     py::gil_scoped_release release;
                     check(driver().cuMemcpyDtoH(out.data(), src, size), "cuMemcpyDtoH");
                 }
                 return py::bytes(out);
             })
        .def("copy",
             [](const ContextState& c, uint64_t dst, uint64_t src, uint64_t size) {
                 if (!size) return;
                 c.make_current();
                 check(driver().cuMemcpyDtoD(dst, src, size), "cuMemcpyDtoD");
             })
        .def("memset",
             [](const ContextState& c, uint64_t dst, int value, uint64_t size) {
                 if (!size) return;
                 c.make_current();
                 check(driver().cuMemsetD8(dst, static_cast<unsigned char>(value), size), "cuMemsetD8");
             })
        .def("synchronize",
             [](const ContextState& c) {
                 c.make_current();
                 py::gil_scoped_release release;
                 check(driver().cuCtxSynchronize(), "cuCtxSynchronize");
             })
        .def("load_module",
             [](const ContextPtr& c, const py::bytes& image, const std::map<std::string, int>& jit_options) {
                 std::string data = image;
                 return std::make_shared<Module>(c, data, jit_options);
             },
             py::arg("image"), py::arg("jit_options") = std::map<std::string, int>{},
             "Load a cubin, fatbin or PTX image (PTX goes through the driver JIT with jit_options).")
        .def("cupti_begin", [](const ContextState&) { cupti_begin(); },
             "Start collecting CUPTI kernel records (for timing kernels launched by others, e.g. a benchmark's app).")
        .def("cupti_kernel_times",
             [](const ContextState& c, uint64_t stream, const std::string& kernel) {
                 std::vector<int64_t> out;
                 for (const auto& [start, end] : cupti_collect(c.context, reinterpret_cast<CUstream>(stream), kernel))
                     out.push_back(static_cast<int64_t>(end - start));
                 return out;
             },
             py::arg("stream"), py::arg("kernel"),
             "Durations (ns) of the kernels named `kernel` that ran on `stream` (a CUstream handle) since "
             "cupti_begin(), in launch order.")
        .def("compare",
             [](const ContextPtr& c, const std::vector<py::tuple>& checks) {
                 std::vector<Check> cs;
                 for (const auto& t : checks) cs.push_back(make_check(t));
                 std::vector<CheckResult> results;
                 {
                     py::gil_scoped_release release;
                     results = compare(c, cs);
                 }
                 py::list out;
                 for (const auto& r : results) out.append(check_result(r));
                 return out;
             },
             "Compare on the device now; each check is (actual, expected, size, dtype, mode, threshold[, hash_elem]) "
             "and gives (stats[7], counters[11]): 5 counters, then the actual's and the expected's 3 hashes.");

    py::class_<Reservation, std::shared_ptr<Reservation>>(m, "Reservation")
        .def_property_readonly("base", &Reservation::base)
        .def_property_readonly("size", &Reservation::size)
        .def_property_readonly("granularity", &Reservation::granularity)
        .def_property_readonly("mapped_bytes", &Reservation::mapped_bytes)
        .def("map", &Reservation::map, py::arg("offset"), py::arg("size"), py::arg("device") = -1)
        .def("unmap", &Reservation::unmap, py::arg("offset"), py::arg("size"))
        .def("release", &Reservation::release);

    py::class_<Module, std::shared_ptr<Module>>(m, "Module")
        .def("function", &Module::function)
        .def("global_", &Module::global, "(address, size) of a module global variable")
        .def_readonly("info_log", &Module::info_log)
        .def_readonly("error_log", &Module::error_log)
        .def_readonly("load_seconds", &Module::load_seconds);

    py::class_<Function>(m, "Function")
        .def_readonly("name", &Function::name)
        .def("attributes", &Function::attributes)
        .def("set_attribute", &Function::set_attribute)
        .def("param_info", &Function::param_info)
        .def(
            "run",
            [](const Function& f, std::array<unsigned, 3> grid, std::array<unsigned, 3> block, unsigned shared_mem,
               const py::bytes& args, int launches, const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& resets,
               const std::vector<py::tuple>& checks, const std::vector<int>& check_launches,
               uint64_t queue_ahead_ns, uint64_t l2_scrub_bytes, double timeout_s, bool cupti,
               const std::vector<std::pair<int, py::bytes>>& attributes, const std::vector<size_t>& param_offsets) {
                std::string arg_bytes = args;
                LaunchSpec spec;
                for (const auto& [id, value] : attributes) spec.attributes.push_back({id, std::string(value)});
                spec.param_offsets = param_offsets;
                std::vector<Copy> copies;
                for (const auto& [dst, src, size] : resets) copies.push_back({dst, src, size});
                std::vector<Check> cs;
                for (const auto& t : checks) cs.push_back(make_check(t));
                RunResult r;
                {
                    py::gil_scoped_release release;
                    r = run_launches(f, grid, block, shared_mem, arg_bytes, launches, copies, cs, check_launches,
                                     queue_ahead_ns, l2_scrub_bytes, timeout_s, cupti, spec);
                }
                py::list per_launch;
                for (const auto& launch : r.checks) {
                    py::list one;
                    for (const auto& c : launch) one.append(check_result(c));
                    per_launch.append(one);
                }
                py::dict out;
                out["times_ns"] = r.times_ns;
                out["checked_launches"] = r.checked_launches;
                out["checks"] = per_launch;
                out["wall_ns"] = r.wall_ns;
                out["gpu_span_ns"] = r.gpu_span_ns;
                out["event_times_ns"] = r.event_times_ns;
                return out;
            },
            py::arg("grid"), py::arg("block"), py::arg("shared_mem"), py::arg("args"), py::arg("launches"),
            py::arg("resets") = std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>{},
            py::arg("checks") = std::vector<py::tuple>{}, py::arg("check_launches") = std::vector<int>{},
            py::arg("queue_ahead_ns") = 0, py::arg("l2_scrub_bytes") = 0, py::arg("timeout_s") = 0.0,
            py::arg("cupti") = false, py::arg("attributes") = std::vector<std::pair<int, py::bytes>>{},
            py::arg("param_offsets") = std::vector<size_t>{},
            "Reset, launch (timed with events; "
            "cuLaunchKernelEx with `attributes`, (id, value bytes) pairs, when given; kernelParams pointing at "
            "`param_offsets` of the argument bytes when given, else the bytes through `extra`) and compare (after "
            "the launches in check_launches), `launches` times; one synchronization at the end.");

    register_profiler(m);
}
