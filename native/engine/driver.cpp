// Loading the CUDA driver at run time (see driver.hpp for why).
#include "driver.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <mutex>

namespace mneme {
namespace {

struct Loaded {
    Driver driver;
    std::string reason;  // empty when usable
};

#define MNEME_STR2(x) #x
#define MNEME_STR(x) MNEME_STR2(x)

Loaded load() {
    Loaded out;
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char* err = dlerror();
        out.reason = std::string("no NVIDIA driver on this machine: dlopen(\"libcuda.so.1\") failed (") +
                     (err ? err : "unknown reason") +
                     "); replay needs a machine with an NVIDIA GPU and its driver";
        return out;
    }
    using GetProc = decltype(&::cuGetProcAddress_v2);
    auto get_proc = reinterpret_cast<GetProc>(dlsym(handle, "cuGetProcAddress_v2"));
    using DriverGetVersion = decltype(&::cuDriverGetVersion);
    auto get_version = reinterpret_cast<DriverGetVersion>(dlsym(handle, "cuDriverGetVersion"));
    if (!get_proc || !get_version) {
        out.reason = "the NVIDIA driver is too old: libcuda.so.1 has no cuGetProcAddress_v2 (CUDA 12 or newer "
                     "drivers have it); update the driver";
        return out;
    }
    int version = 0;
    if (get_version(&version) != CUDA_SUCCESS) {
        out.reason = "cuDriverGetVersion failed; the NVIDIA driver installation looks broken";
        return out;
    }
    out.driver.version = version;
    // Ask for the entry points of the API version we were compiled against, or the
    // driver's own when it is older (it then gives the newest variant it has).
    int api_version = std::min(version, CUDA_VERSION);
    std::string missing;
#define MNEME_RESOLVE(name)                                                                                  \
    {                                                                                                        \
        void* fn = nullptr;                                                                                  \
        CUdriverProcAddressQueryResult status{};                                                             \
        if (get_proc(#name, &fn, api_version, CU_GET_PROC_ADDRESS_DEFAULT, &status) == CUDA_SUCCESS && fn) { \
            out.driver.name = reinterpret_cast<decltype(out.driver.name)>(fn);                               \
        } else {                                                                                             \
            missing += std::string(missing.empty() ? "" : ", ") + #name;                                     \
        }                                                                                                    \
    }
    MNEME_DRIVER_FUNCTIONS(MNEME_RESOLVE)
#undef MNEME_RESOLVE
    if (!missing.empty()) {
        out.reason = "the NVIDIA driver (version " + std::to_string(version) + ") lacks entry points the engine needs (" +
                     missing + "); update the driver";
        return out;
    }
    CUresult init = out.driver.cuInit(0);
    if (init != CUDA_SUCCESS) {
        const char* name = nullptr;
        out.driver.cuGetErrorName(init, &name);
        out.reason = std::string("the CUDA driver failed to initialise (cuInit: ") + (name ? name : "?") +
                     "); is a GPU visible to this process (CUDA_VISIBLE_DEVICES, container device access)?";
        return out;
    }
    int count = 0;
    if (out.driver.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
        out.reason = "the CUDA driver sees no GPU; check CUDA_VISIBLE_DEVICES and the container's device access";
        return out;
    }
    return out;
}

const Loaded& loaded() {
    static std::once_flag once;
    static Loaded* instance = nullptr;
    std::call_once(once, [] { instance = new Loaded(load()); });  // never freed: lives as long as the process
    return *instance;
}

std::atomic<bool> g_abandoned{false};

}  // namespace

void abandon_driver_cleanup() { g_abandoned = true; }
bool driver_cleanup_abandoned() { return g_abandoned; }

const Driver& driver() {
    const Loaded& l = loaded();
    if (!l.reason.empty()) throw DriverUnavailable(l.reason);
    return l.driver;
}

std::string driver_unavailable_reason() { return loaded().reason; }

std::string error_name(CUresult result) {
    const Loaded& l = loaded();
    const char* name = nullptr;
    if (l.driver.cuGetErrorName && l.driver.cuGetErrorName(result, &name) == CUDA_SUCCESS && name) return name;
    return "CUDA_ERROR_" + std::to_string(static_cast<int>(result));
}

void check(CUresult result, const char* call) {
    if (result != CUDA_SUCCESS) throw CudaError(result, error_name(result), call);
}

}  // namespace mneme
