// mneme._ptxcompiler: PTX to cubin in-process, through NVIDIA's nvPTXCompiler
// library (ptxas as a C library: the same cubin as the ptxas program given
// the same options, without starting a process per compile).
//
// compile(ptx, options) -> (cubin, info_log); options are ptxas options in
// the library's single-token spelling (--gpu-name=sm_90, -O3,
// --maxrregcount=32). A failure raises mneme._ptxcompiler.CompileError whose
// message is the compiler's error log, with .status (the nvPTXCompileResult
// name) and .log. The GIL is released while the library works.
#include <nvPTXCompiler.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>
#include <vector>

#ifndef MNEME_NVPTXCOMPILER_IDENTITY
#error "the build defines MNEME_NVPTXCOMPILER_IDENTITY (where the library came from, its version and hash)"
#endif

namespace py = pybind11;

namespace {

const char* status_name(nvPTXCompileResult r) {
    switch (r) {
        case NVPTXCOMPILE_SUCCESS: return "NVPTXCOMPILE_SUCCESS";
        case NVPTXCOMPILE_ERROR_INVALID_COMPILER_HANDLE: return "NVPTXCOMPILE_ERROR_INVALID_COMPILER_HANDLE";
        case NVPTXCOMPILE_ERROR_INVALID_INPUT: return "NVPTXCOMPILE_ERROR_INVALID_INPUT";
        case NVPTXCOMPILE_ERROR_COMPILATION_FAILURE: return "NVPTXCOMPILE_ERROR_COMPILATION_FAILURE";
        case NVPTXCOMPILE_ERROR_INTERNAL: return "NVPTXCOMPILE_ERROR_INTERNAL";
        case NVPTXCOMPILE_ERROR_OUT_OF_MEMORY: return "NVPTXCOMPILE_ERROR_OUT_OF_MEMORY";
        case NVPTXCOMPILE_ERROR_COMPILER_INVOCATION_INCOMPLETE:
            return "NVPTXCOMPILE_ERROR_COMPILER_INVOCATION_INCOMPLETE";
        case NVPTXCOMPILE_ERROR_UNSUPPORTED_PTX_VERSION: return "NVPTXCOMPILE_ERROR_UNSUPPORTED_PTX_VERSION";
        case NVPTXCOMPILE_ERROR_UNSUPPORTED_DEVSIDE_SYNC: return "NVPTXCOMPILE_ERROR_UNSUPPORTED_DEVSIDE_SYNC";
        case NVPTXCOMPILE_ERROR_CANCELLED: return "NVPTXCOMPILE_ERROR_CANCELLED";
    }
    return "NVPTXCOMPILE_ERROR_UNKNOWN";
}

struct CompileFailure : std::runtime_error {
    CompileFailure(const std::string& status, const std::string& log)
        : std::runtime_error(log.empty() ? status : status + ": " + log), status(status), log(log) {}
    std::string status, log;
};

// Owns one compiler handle.
class Handle {
public:
    explicit Handle(const std::string& ptx) { check(nvPTXCompilerCreate(&h_, ptx.size(), ptx.data()), "create"); }
    ~Handle() {
        if (h_) nvPTXCompilerDestroy(&h_);
    }
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    nvPTXCompilerHandle get() const { return h_; }

    std::string log(nvPTXCompileResult (*size_of)(nvPTXCompilerHandle, size_t*),
                    nvPTXCompileResult (*read)(nvPTXCompilerHandle, char*)) const {
        size_t size = 0;
        if (size_of(h_, &size) != NVPTXCOMPILE_SUCCESS || size == 0) return "";
        std::string text(size + 1, '\0');
        if (read(h_, text.data()) != NVPTXCOMPILE_SUCCESS) return "";
        text.resize(text.find('\0'));
        while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
        return text;
    }
    std::string error_log() const { return log(nvPTXCompilerGetErrorLogSize, nvPTXCompilerGetErrorLog); }
    std::string info_log() const { return log(nvPTXCompilerGetInfoLogSize, nvPTXCompilerGetInfoLog); }

    void check(nvPTXCompileResult r, const char* what) const {
        if (r == NVPTXCOMPILE_SUCCESS) return;
        std::string log = h_ ? error_log() : "";
        throw CompileFailure(status_name(r), log.empty() ? std::string("nvPTXCompiler ") + what + " failed" : log);
    }

private:
    nvPTXCompilerHandle h_ = nullptr;
};

std::string text_of(const py::object& ptx) {
    if (py::isinstance<py::bytes>(ptx)) return ptx.cast<std::string>();
    if (py::isinstance<py::str>(ptx)) return ptx.cast<std::string>();  // UTF-8
    throw py::type_error("ptx must be bytes or str");
}

py::tuple compile(const py::object& ptx, const std::vector<std::string>& options) {
    const std::string source = text_of(ptx);
    std::vector<const char*> argv;
    argv.reserve(options.size());
    for (const auto& o : options) argv.push_back(o.c_str());
    std::string cubin, info;
    {
        py::gil_scoped_release release;
        Handle h(source);
        h.check(nvPTXCompilerCompile(h.get(), static_cast<int>(argv.size()), argv.data()), "compile");
        size_t size = 0;
        h.check(nvPTXCompilerGetCompiledProgramSize(h.get(), &size), "size query");
        cubin.resize(size);
        h.check(nvPTXCompilerGetCompiledProgram(h.get(), cubin.data()), "program read");
        info = h.info_log();
    }
    return py::make_tuple(py::bytes(cubin), info);
}

std::string version() {
    unsigned major = 0, minor = 0;
    nvPTXCompilerGetVersion(&major, &minor);
    return "nvPTXCompiler " + std::to_string(major) + "." + std::to_string(minor) + " (" +
           MNEME_NVPTXCOMPILER_IDENTITY + ")";
}

}  // namespace

PYBIND11_MODULE(_ptxcompiler, m) {
    m.doc() = "PTX to cubin in-process through NVIDIA's nvPTXCompiler library (ptxas as a library)";

    // CompileError(RuntimeError) with .status and .log, raised from the translator below.
    static py::handle error_type = PyErr_NewException("mneme._ptxcompiler.CompileError", PyExc_RuntimeError, nullptr);
    m.attr("CompileError") = error_type;
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const CompileFailure& e) {
            py::object error = py::reinterpret_borrow<py::object>(error_type)(e.what());
            error.attr("status") = e.status;
            error.attr("log") = e.log;
            PyErr_SetObject(error_type.ptr(), error.ptr());
        }
    });

    m.def("compile", &compile, py::arg("ptx"), py::arg("options"),
          "Compile PTX (bytes or str) with ptxas options in single-token form; returns (cubin, info_log).");
    m.def("version", &version, "The compiler's identity: API version, origin, full version and archive hash.");
}
