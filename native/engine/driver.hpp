// The CUDA driver API, loaded at run time.
//
// The engine never links libcuda: it dlopen()s "libcuda.so.1" on first use and
// resolves every entry point through cuGetProcAddress, so the module builds and
// imports on machines with the toolkit but no driver (CI), and says why it
// cannot run there instead of failing to load.
#pragma once

#include <cuda.h>

#include <stdexcept>
#include <string>

namespace mneme {

// An error returned by a driver call: the CUresult, its name and the call.
class CudaError : public std::runtime_error {
public:
    CudaError(CUresult code, std::string name, const std::string& call)
        : std::runtime_error(call + " failed: " + name + " (" + std::to_string(static_cast<int>(code)) + ")"),
          code(code), name(std::move(name)), call(call) {}
    CUresult code;
    std::string name;
    std::string call;
};

// The driver could not be loaded or initialised (no driver, no GPU).
class DriverUnavailable : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

#define MNEME_DRIVER_FUNCTIONS(X)            \
    X(cuInit)                                \
    X(cuDriverGetVersion)                    \
    X(cuGetErrorName)                        \
    X(cuGetErrorString)                      \
    X(cuDeviceGetCount)                      \
    X(cuDeviceGet)                           \
    X(cuDeviceGetName)                       \
    X(cuDeviceGetAttribute)                  \
    X(cuDeviceTotalMem)                      \
    X(cuDevicePrimaryCtxRetain)              \
    X(cuDevicePrimaryCtxRelease)             \
    X(cuCtxSetCurrent)                       \
    X(cuCtxSynchronize)                      \
    X(cuMemAlloc)                            \
    X(cuMemFree)                             \
    X(cuMemGetInfo)                          \
    X(cuMemcpyHtoD)                          \
    X(cuMemcpyDtoH)                          \
    X(cuMemcpyDtoD)                          \
    X(cuMemcpyHtoDAsync)                     \
    X(cuMemcpyDtoDAsync)                     \
    X(cuMemsetD8)                            \
    X(cuMemAddressReserve)                   \
    X(cuMemAddressFree)                      \
    X(cuMemCreate)                           \
    X(cuMemRelease)                          \
    X(cuMemMap)                              \
    X(cuMemUnmap)                            \
    X(cuMemSetAccess)                        \
    X(cuMemGetAllocationGranularity)         \
    X(cuModuleLoadDataEx)                    \
    X(cuModuleUnload)                        \
    X(cuModuleGetFunction)                   \
    X(cuModuleGetGlobal)                     \
    X(cuFuncGetAttribute)                    \
    X(cuFuncSetAttribute)                    \
    X(cuFuncGetParamInfo)                    \
    X(cuLaunchKernel)                        \
    X(cuLaunchKernelEx)                      \
    X(cuStreamCreate)                        \
    X(cuStreamDestroy)                       \
    X(cuStreamSynchronize)                   \
    X(cuStreamQuery)                         \
    X(cuEventCreate)                         \
    X(cuEventDestroy)                        \
    X(cuEventRecord)                         \
    X(cuEventElapsedTime)                    \
    X(cuEventQuery)                          \
    X(cuMemHostAlloc)                        \
    X(cuMemHostGetDevicePointer)             \
    X(cuMemFreeHost)                         \
    X(cuMemcpyDtoHAsync)                     \
    X(cuEventSynchronize)                    \
    X(cuArray3DCreate)                       \
    X(cuArrayDestroy)                        \
    X(cuMemcpy3D)                            \
    X(cuMemcpy3DAsync)                       \
    X(cuTexObjectCreate)                     \
    X(cuTexObjectDestroy)                    \
    X(cuSurfObjectCreate)                    \
    X(cuSurfObjectDestroy)

struct Driver {
#define MNEME_DECLARE(name) decltype(&::name) name = nullptr;
    MNEME_DRIVER_FUNCTIONS(MNEME_DECLARE)
#undef MNEME_DECLARE
    int version = 0;  // cuDriverGetVersion, e.g. 13000
};

// The loaded driver; throws DriverUnavailable saying why when it cannot be used.
const Driver& driver();

// Empty when the driver loads and initialises, else the reason it does not.
std::string driver_unavailable_reason();

// Throws CudaError for anything but CUDA_SUCCESS.
void check(CUresult result, const char* call);

// Once the context is lost (a kernel fault, a kernel that never ends), destructors
// stop calling the driver: freeing could block forever on the busy context, and the
// process is going away anyway.
void abandon_driver_cleanup();
bool driver_cleanup_abandoned();

// The name of a CUresult ("CUDA_ERROR_ILLEGAL_ADDRESS").
std::string error_name(CUresult result);

}  // namespace mneme
