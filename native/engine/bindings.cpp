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

// The descriptors of a texture or surface object, from the dicts of mneme.format.textures
// (Resource, TextureDesc, ViewDesc .to_dict()): the driver's numbers, as recorded.
template <typename T>
T field(const py::dict& d, const char* key) {
    if (!d.contains(key)) throw std::invalid_argument(std::string("a descriptor lacks its '") + key + "'");
    return d[key].cast<T>();
}

CUDA_RESOURCE_DESC resource_desc(const py::dict& d) {
    CUDA_RESOURCE_DESC r;
    std::memset(&r, 0, sizeof r);
    const std::string type = field<std::string>(d, "type");
    if (type == "array") {
        r.resType = CU_RESOURCE_TYPE_ARRAY;
        r.res.array.hArray = reinterpret_cast<CUarray>(field<uint64_t>(d, "array"));
    } else if (type == "linear") {
        r.resType = CU_RESOURCE_TYPE_LINEAR;
        r.res.linear.devPtr = field<uint64_t>(d, "address");
        r.res.linear.format = static_cast<CUarray_format>(field<int>(d, "format"));
        r.res.linear.numChannels = field<unsigned>(d, "channels");
        r.res.linear.sizeInBytes = field<uint64_t>(d, "size");
    } else if (type == "pitch2d") {
        r.resType = CU_RESOURCE_TYPE_PITCH2D;
        r.res.pitch2D.devPtr = field<uint64_t>(d, "address");
        r.res.pitch2D.format = static_cast<CUarray_format>(field<int>(d, "format"));
        r.res.pitch2D.numChannels = field<unsigned>(d, "channels");
        r.res.pitch2D.width = field<uint64_t>(d, "width");
        r.res.pitch2D.height = field<uint64_t>(d, "height");
        r.res.pitch2D.pitchInBytes = field<uint64_t>(d, "pitch");
    } else {
        throw std::invalid_argument("a resource's type is 'array', 'linear' or 'pitch2d', not '" + type + "'");
    }
    return r;
}

CUDA_TEXTURE_DESC texture_desc(const py::dict& d) {
    CUDA_TEXTURE_DESC t;
    std::memset(&t, 0, sizeof t);
    auto modes = field<std::vector<int>>(d, "address_mode");
    auto border = field<std::vector<float>>(d, "border_color");
    if (modes.size() != 3 || border.size() != 4)
        throw std::invalid_argument("a texture descriptor has 3 address modes and 4 border colour components");
    for (int i = 0; i < 3; ++i) t.addressMode[i] = static_cast<CUaddress_mode>(modes[i]);
    for (int i = 0; i < 4; ++i) t.borderColor[i] = border[i];
    t.filterMode = static_cast<CUfilter_mode>(field<int>(d, "filter_mode"));
    t.flags = field<unsigned>(d, "flags");
    t.maxAnisotropy = field<unsigned>(d, "max_anisotropy");
    t.mipmapFilterMode = static_cast<CUfilter_mode>(field<int>(d, "mipmap_filter_mode"));
    t.mipmapLevelBias = field<float>(d, "mipmap_level_bias");
    t.minMipmapLevelClamp = field<float>(d, "min_mipmap_level_clamp");
    t.maxMipmapLevelClamp = field<float>(d, "max_mipmap_level_clamp");
    return t;
}

CUDA_RESOURCE_VIEW_DESC view_desc(const py::dict& d) {
    CUDA_RESOURCE_VIEW_DESC v;
    std::memset(&v, 0, sizeof v);
    v.format = static_cast<CUresourceViewFormat>(field<int>(d, "format"));
    v.width = field<uint64_t>(d, "width");
    v.height = field<uint64_t>(d, "height");
    v.depth = field<uint64_t>(d, "depth");
    v.firstMipmapLevel = field<unsigned>(d, "first_mipmap_level");
    v.lastMipmapLevel = field<unsigned>(d, "last_mipmap_level");
    v.firstLayer = field<unsigned>(d, "first_layer");
    v.lastLayer = field<unsigned>(d, "last_layer");
    return v;
}

// An ArrayCopy as Python gives it: (array, linear, width_bytes, height, depth).
using ArrayCopyTuple = std::tuple<uint64_t, uint64_t, uint64_t, uint64_t, uint64_t>;

std::vector<ArrayCopy> array_copies(const std::vector<ArrayCopyTuple>& in) {
    std::vector<ArrayCopy> out;
    for (const auto& [array, linear, width_bytes, height, depth] : in)
        out.push_back({array, linear, width_bytes, height, depth});
    return out;
}

// (stats[7], counters[11]): the 5 counters, then the 6 hashes (zero unless hash_elem was given).
py::tuple check_result(const CheckResult& r) {
    py::tuple stats(7), counters(11);
    for (size_t i = 0; i < 7; ++i) stats[i] = r.stats[i];
    for (size_t i = 0; i < 5; ++i) counters[i] = r.counters[i];
    for (size_t i = 0; i < 6; ++i) counters[5 + i] = r.hashes[i];
    return py::make_tuple(stats, counters);
}

std::vector<BatchItem> batch_items(const std::vector<py::tuple>& items) {
    std::vector<BatchItem> batch(items.size());
    for (size_t k = 0; k < items.size(); ++k) {
        const py::tuple& t = items[k];
        if (t.size() != 12)
            throw std::invalid_argument(
                "a batch item is (function, grid, block, shared_mem, args, launches, before, resets, checks, "
                "check_launches, attributes, param_offsets)");
        BatchItem& b = batch[k];
        b.function = std::make_shared<Function>(t[0].cast<const Function&>());
        b.grid = t[1].cast<std::array<unsigned, 3>>();
        b.block = t[2].cast<std::array<unsigned, 3>>();
        b.shared_mem = t[3].cast<unsigned>();
        b.args = t[4].cast<std::string>();
        b.launches = t[5].cast<int>();
        for (const auto& [dst, src, size] : t[6].cast<std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>>())
            b.before.push_back({dst, src, size});
        for (const auto& [dst, src, size] : t[7].cast<std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>>())
            b.resets.push_back({dst, src, size});
        for (const auto& check : t[8].cast<std::vector<py::tuple>>()) b.checks.push_back(make_check(check));
        b.check_launches = t[9].cast<std::vector<int>>();
        for (const auto& [id, value] : t[10].cast<std::vector<std::pair<int, py::bytes>>>())
            b.spec.attributes.push_back({id, std::string(value)});
        b.spec.param_offsets = t[11].cast<std::vector<size_t>>();
    }
    return batch;
}

// What Function.run gives: times, checked launches, their checks' results, wall and GPU span.
py::dict run_result(const RunResult& r) {
    py::list per_launch;
    for (const auto& launch : r.checks) {
        py::list one;
        for (const auto& check : launch) one.append(check_result(check));
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
}

// One dict per item, as Function.run gives.
py::list run_results(const std::vector<RunResult>& results) {
    py::list out;
    for (const auto& r : results) out.append(run_result(r));
    return out;
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
        .def("create_array",
             [](const ContextPtr& c, uint64_t width, uint64_t height, uint64_t depth, int format, unsigned channels,
                unsigned flags) {
                 CUDA_ARRAY3D_DESCRIPTOR desc{};
                 desc.Width = width;
                 desc.Height = height;
                 desc.Depth = depth;
                 desc.Format = static_cast<CUarray_format>(format);
                 desc.NumChannels = channels;
                 desc.Flags = flags;
                 return std::make_shared<CudaArray>(c, desc);
             },
             py::arg("width"), py::arg("height"), py::arg("depth"), py::arg("format"), py::arg("channels"),
             py::arg("flags") = 0, "A CUDA array (cuArray3DCreate); height 0: 1-D, depth 0: 1-D or 2-D.")
        .def("copy_to_array",
             [](const ContextState& c, uint64_t array, uint64_t src, uint64_t width_bytes, uint64_t height,
                uint64_t depth) {
                 py::gil_scoped_release release;
                 copy_array(c, ArrayCopy{array, src, width_bytes, height, depth}, true, nullptr);
             },
             py::arg("array"), py::arg("src"), py::arg("width_bytes"), py::arg("height"), py::arg("depth"),
             "Fill a CUDA array from packed rows in device memory (cuMemcpy3D).")
        .def("copy_from_array",
             [](const ContextState& c, uint64_t dst, uint64_t array, uint64_t width_bytes, uint64_t height,
                uint64_t depth) {
                 py::gil_scoped_release release;
                 copy_array(c, ArrayCopy{array, dst, width_bytes, height, depth}, false, nullptr);
             },
             py::arg("dst"), py::arg("array"), py::arg("width_bytes"), py::arg("height"), py::arg("depth"),
             "Copy a CUDA array into packed rows in device memory (cuMemcpy3D).")
        .def("texture_object",
             [](const ContextPtr& c, const py::dict& resource, const py::dict& texture, const py::object& view) {
                 CUDA_RESOURCE_DESC r = resource_desc(resource);
                 CUDA_TEXTURE_DESC t = texture_desc(texture);
                 CUDA_RESOURCE_VIEW_DESC v{};
                 const bool has_view = !view.is_none();
                 if (has_view) v = view_desc(view.cast<py::dict>());
                 return std::make_shared<SamplerObject>(c, r, &t, has_view ? &v : nullptr);
             },
             py::arg("resource"), py::arg("texture"), py::arg("view") = py::none(),
             "A texture object (cuTexObjectCreate) from the recorded descriptors (mneme.format.textures dicts).")
        .def("surface_object",
             [](const ContextPtr& c, const py::dict& resource) {
                 return std::make_shared<SamplerObject>(c, resource_desc(resource), nullptr, nullptr);
             },
             py::arg("resource"), "A surface object (cuSurfObjectCreate) over a CUDA array.")
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
             "and gives (stats[7], counters[11]): 5 counters, then the actual's and the expected's 3 hashes.")
        .def("start_batch",
             [](const ContextPtr& c, const std::vector<py::tuple>& items, uint64_t gate_max_ns) {
                 std::vector<BatchItem> batch = batch_items(items);
                 py::gil_scoped_release release;
                 return start_batch(c, std::move(batch), gate_max_ns);
             },
             py::arg("items"), py::arg("gate_max_ns") = 1'000'000'000ull,
             "Enqueue several configurations (engine.hpp's BatchRun) and return without waiting for the GPU: "
             "each item is (function, grid, block, shared_mem, args, launches, before, resets, checks, "
             "check_launches, attributes, param_offsets). BatchRun.wait() gives one dict per item, "
             "as Function.run does.")
        .def("run_batch",
             [](const ContextPtr& c, const std::vector<py::tuple>& items, double timeout_s, uint64_t gate_max_ns) {
                 std::vector<BatchItem> batch = batch_items(items);
                 std::vector<RunResult> results;
                 {
                     py::gil_scoped_release release;
                     results = run_batch(c, std::move(batch), timeout_s, gate_max_ns);
                 }
                 return run_results(results);
             },
             py::arg("items"), py::arg("timeout_s") = 0.0, py::arg("gate_max_ns") = 1'000'000'000ull,
             "start_batch, then wait: one dict per item.");

    py::class_<BatchRun, std::shared_ptr<BatchRun>>(m, "BatchRun")
        .def("wait",
             [](BatchRun& b, double timeout_s) {
                 std::vector<RunResult> results;
                 {
                     py::gil_scoped_release release;
                     results = b.wait(timeout_s);
                 }
                 return run_results(results);
             },
             py::arg("timeout_s") = 0.0,
             "Wait for the batch's GPU work (timeout_s > 0 bounds the wait) and give one dict per item.")
        .def("done", &BatchRun::done, "Whether the GPU is done with the batch (or failed), without waiting.");

    py::class_<CudaArray, std::shared_ptr<CudaArray>>(m, "Array")
        .def_property_readonly("handle", &CudaArray::handle)
        .def("free", &CudaArray::free);

    py::class_<SamplerObject, std::shared_ptr<SamplerObject>>(m, "SamplerObject")
        .def_property_readonly("handle", &SamplerObject::handle)
        .def_property_readonly("surface", &SamplerObject::surface)
        .def("free", &SamplerObject::free);

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
               const std::vector<std::pair<int, py::bytes>>& attributes, const std::vector<size_t>& param_offsets,
               const std::vector<ArrayCopyTuple>& array_resets, const std::vector<ArrayCopyTuple>& array_readbacks) {
                std::string arg_bytes = args;
                LaunchSpec spec;
                for (const auto& [id, value] : attributes) spec.attributes.push_back({id, std::string(value)});
                spec.param_offsets = param_offsets;
                spec.array_resets = array_copies(array_resets);
                spec.array_readbacks = array_copies(array_readbacks);
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
                return run_result(r);
            },
            py::arg("grid"), py::arg("block"), py::arg("shared_mem"), py::arg("args"), py::arg("launches"),
            py::arg("resets") = std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>{},
            py::arg("checks") = std::vector<py::tuple>{}, py::arg("check_launches") = std::vector<int>{},
            py::arg("queue_ahead_ns") = 0, py::arg("l2_scrub_bytes") = 0, py::arg("timeout_s") = 0.0,
            py::arg("cupti") = false, py::arg("attributes") = std::vector<std::pair<int, py::bytes>>{},
            py::arg("param_offsets") = std::vector<size_t>{},
            py::arg("array_resets") = std::vector<ArrayCopyTuple>{},
            py::arg("array_readbacks") = std::vector<ArrayCopyTuple>{},
            "Reset (`array_resets`: (array, linear, width_bytes, height, depth) copies into CUDA arrays after the "
            "resets), launch (timed with events; "
            "cuLaunchKernelEx with `attributes`, (id, value bytes) pairs, when given; kernelParams pointing at "
            "`param_offsets` of the argument bytes when given, else the bytes through `extra`) and compare (after "
            "the launches in check_launches, after `array_readbacks` copied those arrays into linear memory), "
            "`launches` times; one synchronization at the end.");

    register_profiler(m);
}
