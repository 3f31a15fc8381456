// A stand-in for libcuda.so.1 on machines without a GPU: the driver entry points the reproducer uses,
// with "device" memory in host memory and the kernels of the synthetic recordings run on the host.
//
// Built as libcuda.so.1 and found through LD_LIBRARY_PATH by tests/mneme/reproducer/test_reproducer.py, it lets
// the generated program's own logic run here: placement at the recorded addresses (mmap at the address)
// or relocation, pointer rewriting, resets between launches, globals by name, the comparison and its
// report, exit statuses. FAKE_CUDA_TAKEN=1 makes every fixed-address reservation land elsewhere.
#include <cuda.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

struct Module {
    std::map<std::string, std::vector<uint64_t>> globals;
};
struct Function {
    std::string name;
    Module* module;
};
struct Span {
    uint64_t start, end;
};

std::vector<Span> mapped;  // what a kernel may touch
CUresult sticky = CUDA_SUCCESS;  // a fault, reported by the next wait
bool hanging = false;

bool inside(uint64_t p, uint64_t bytes) {
    for (const Span& s : mapped)
        if (p >= s.start && p + bytes <= s.end) return true;
    return false;
}

// The parameter layouts of the synthetic recordings' kernels (tests/replay/data/kernels.cu, vecadd).
const std::map<std::string, std::vector<std::pair<size_t, size_t>>> kParams = {
    {"_Z6vecaddPKfS0_Pfi", {{0, 8}, {8, 8}, {16, 8}, {24, 4}}},
    {"axpy_count", {{0, 8}, {8, 8}, {16, 4}, {20, 4}, {24, 8}}},
    {"scale_by_global", {{0, 8}, {8, 4}}},
    {"gather_sum", {{0, 8}, {8, 4}, {16, 8}}},
    {"hang_until", {{0, 8}}},
};

template <typename T>
T arg(const std::vector<uint8_t>& args, size_t offset) {
    T v;
    std::memcpy(&v, args.data() + offset, sizeof v);
    return v;
}

void run_kernel(const Function& f, uint64_t threads, void** params, void** extra) {
    auto layout = kParams.find(f.name);
    if (layout == kParams.end()) return;  // the queue-ahead spin kernel, or anything else: nothing to do
    std::vector<uint8_t> args(64, 0);
    if (params) {
        for (size_t i = 0; i < layout->second.size(); ++i)
            std::memcpy(args.data() + layout->second[i].first, params[i], layout->second[i].second);
    } else if (extra) {
        std::memcpy(args.data(), extra[1], *static_cast<size_t*>(extra[3]));
    }
    if (f.name == "_Z6vecaddPKfS0_Pfi") {
        auto a = arg<float*>(args, 0), b = arg<float*>(args, 8), c = arg<float*>(args, 16);
        uint64_t n = std::min<uint64_t>(arg<int>(args, 24), threads);
        for (float* p : {a, b, c})
            if (!inside(reinterpret_cast<uint64_t>(p), 4 * n)) return void(sticky = CUDA_ERROR_ILLEGAL_ADDRESS);
        for (uint64_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
    } else if (f.name == "axpy_count") {
        auto x = arg<float*>(args, 0), y = arg<float*>(args, 8);
        auto alpha = arg<float>(args, 16);
        uint64_t n = std::min<uint64_t>(arg<int>(args, 20), threads);
        for (uint64_t i = 0; i < n; ++i) x[i] = x[i] * alpha + y[i];
        *arg<unsigned*>(args, 24) += static_cast<unsigned>(n);
    } else if (f.name == "scale_by_global") {
        auto out = arg<int*>(args, 0);
        uint64_t n = std::min<uint64_t>(arg<int>(args, 8), threads);
        auto scale = reinterpret_cast<int*>(f.module->globals["g_scale"].data());
        auto hits = reinterpret_cast<unsigned*>(f.module->globals["g_hits"].data());
        for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<int>(i) * scale[i & 3];
        *hits += static_cast<unsigned>(n);
    } else if (f.name == "gather_sum") {
        struct Node {
            const float* data;
            int count, pad;
        };
        auto nodes = arg<Node*>(args, 0);
        auto out = arg<float*>(args, 16);
        uint64_t n = std::min<uint64_t>(arg<int>(args, 8), threads);
        for (uint64_t i = 0; i < n; ++i) {
            if (!inside(reinterpret_cast<uint64_t>(nodes[i].data), 4ull * nodes[i].count))
                return void(sticky = CUDA_ERROR_ILLEGAL_ADDRESS);
            float s = 0;
            for (int k = 0; k < nodes[i].count; ++k) s += nodes[i].data[k];
            out[i] = s;
        }
    } else if (f.name == "hang_until") {
        hanging = true;
    }
}

CUresult fake_cuInit(unsigned) { return CUDA_SUCCESS; }
CUresult fake_cuGetErrorName(CUresult r, const char** name) {
    static std::map<int, std::string> names;
    names[r] = r == CUDA_ERROR_ILLEGAL_ADDRESS ? "CUDA_ERROR_ILLEGAL_ADDRESS" : "CUDA_ERROR_FAKE_" + std::to_string(r);
    *name = names[r].c_str();
    return CUDA_SUCCESS;
}
CUresult fake_cuDeviceGetCount(int* n) { return *n = 1, CUDA_SUCCESS; }
CUresult fake_cuDeviceGet(CUdevice* d, int ordinal) { return *d = ordinal, CUDA_SUCCESS; }
CUresult fake_cuDeviceGetName(char* name, int len, CUdevice) {
    std::strncpy(name, "fake GPU (host memory)", static_cast<size_t>(len));
    return CUDA_SUCCESS;
}
CUresult fake_cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice) {
    *v = a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ? 9 : 0;
    return CUDA_SUCCESS;
}
CUresult fake_cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice) {
    static int context;
    *c = reinterpret_cast<CUcontext>(&context);
    return CUDA_SUCCESS;
}
CUresult fake_cuCtxSetCurrent(CUcontext) { return CUDA_SUCCESS; }
CUresult fake_cuMemAlloc(CUdeviceptr* p, size_t bytes) {
    void* m = std::calloc(1, bytes);
    *p = reinterpret_cast<CUdeviceptr>(m);
    mapped.push_back({*p, *p + bytes});
    return CUDA_SUCCESS;
}
CUresult fake_cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t n) {
    std::memcpy(reinterpret_cast<void*>(dst), src, n);
    return CUDA_SUCCESS;
}
CUresult fake_cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n) {
    std::memcpy(dst, reinterpret_cast<void*>(src), n);
    return CUDA_SUCCESS;
}
CUresult fake_cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream) {
    std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), n);
    return CUDA_SUCCESS;
}
CUresult fake_cuMemAddressReserve(CUdeviceptr* p, size_t size, size_t, CUdeviceptr addr, unsigned long long) {
    void* m = MAP_FAILED;
    if (!std::getenv("FAKE_CUDA_TAKEN"))
        m = mmap(reinterpret_cast<void*>(addr), size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (m == MAP_FAILED)
        m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = reinterpret_cast<CUdeviceptr>(m);
    return CUDA_SUCCESS;
}
CUresult fake_cuMemAddressFree(CUdeviceptr p, size_t size) {
    munmap(reinterpret_cast<void*>(p), size);
    return CUDA_SUCCESS;
}
CUresult fake_cuMemCreate(CUmemGenericAllocationHandle* h, size_t, const CUmemAllocationProp*, unsigned long long) {
    return *h = 1, CUDA_SUCCESS;
}
CUresult fake_cuMemRelease(CUmemGenericAllocationHandle) { return CUDA_SUCCESS; }
CUresult fake_cuMemMap(CUdeviceptr p, size_t size, size_t, CUmemGenericAllocationHandle, unsigned long long) {
    mapped.push_back({p, p + size});
    return CUDA_SUCCESS;
}
CUresult fake_cuMemUnmap(CUdeviceptr, size_t) { return CUDA_SUCCESS; }
CUresult fake_cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) { return CUDA_SUCCESS; }
CUresult fake_cuMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) {
    return *g = 2 << 20, CUDA_SUCCESS;
}
CUresult fake_cuModuleLoadDataEx(CUmodule* m, const void*, unsigned, CUjit_option*, void**) {
    *m = reinterpret_cast<CUmodule>(new Module);
    return CUDA_SUCCESS;
}
CUresult fake_cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
    *f = reinterpret_cast<CUfunction>(new Function{name, reinterpret_cast<Module*>(m)});
    return CUDA_SUCCESS;
}
CUresult fake_cuModuleGetGlobal(CUdeviceptr* p, size_t* bytes, CUmodule m, const char* name) {
    std::string n = name;
    if (n != "g_scale" && n != "g_hits") return CUDA_ERROR_NOT_FOUND;
    auto& g = reinterpret_cast<Module*>(m)->globals[n];
    g.assign(4, 0);
    *p = reinterpret_cast<CUdeviceptr>(g.data());
    *bytes = n == "g_scale" ? 16 : 4;
    mapped.push_back({*p, *p + *bytes});
    return CUDA_SUCCESS;
}
CUresult fake_cuFuncGetAttribute(int* v, CUfunction_attribute a, CUfunction) {
    *v = a == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK             ? 1024
         : a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES ? 49152
                                                                : 0;
    return CUDA_SUCCESS;
}
CUresult fake_cuFuncSetAttribute(CUfunction, CUfunction_attribute, int) { return CUDA_SUCCESS; }
CUresult fake_cuFuncGetParamInfo(CUfunction f, size_t i, size_t* offset, size_t* size) {
    auto layout = kParams.find(reinterpret_cast<Function*>(f)->name);
    if (layout == kParams.end() || i >= layout->second.size()) return CUDA_ERROR_INVALID_VALUE;
    *offset = layout->second[i].first, *size = layout->second[i].second;
    return CUDA_SUCCESS;
}
CUresult fake_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                             unsigned, CUstream, void** params, void** extra) {
    run_kernel(*reinterpret_cast<Function*>(f), uint64_t(gx) * gy * gz * bx * by * bz, params, extra);
    return CUDA_SUCCESS;
}
CUresult fake_cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
    return fake_cuLaunchKernel(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                               c->sharedMemBytes, c->hStream, params, extra);
}
CUresult fake_cuStreamCreate(CUstream* s, unsigned) {
    static int stream;
    *s = reinterpret_cast<CUstream>(&stream);
    return CUDA_SUCCESS;
}
CUresult fake_cuStreamQuery(CUstream) {
    return sticky != CUDA_SUCCESS ? sticky : hanging ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
CUresult fake_cuStreamSynchronize(CUstream) { return sticky; }
CUresult fake_cuEventCreate(CUevent* e, unsigned) {
    *e = reinterpret_cast<CUevent>(new int64_t(0));
    return CUDA_SUCCESS;
}
CUresult fake_cuEventRecord(CUevent e, CUstream) {
    *reinterpret_cast<int64_t*>(e) = std::chrono::steady_clock::now().time_since_epoch().count();
    return CUDA_SUCCESS;
}
CUresult fake_cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
    *ms = static_cast<float>(*reinterpret_cast<int64_t*>(b) - *reinterpret_cast<int64_t*>(a)) * 1e-6f;
    return CUDA_SUCCESS;
}

#define FAKE_ENTRY(name) {#name, reinterpret_cast<void*>(static_cast<decltype(&::name)>(&fake_##name))}
const std::map<std::string, void*> kEntries = {
    FAKE_ENTRY(cuInit), FAKE_ENTRY(cuGetErrorName), FAKE_ENTRY(cuDeviceGetCount), FAKE_ENTRY(cuDeviceGet),
    FAKE_ENTRY(cuDeviceGetName), FAKE_ENTRY(cuDeviceGetAttribute), FAKE_ENTRY(cuDevicePrimaryCtxRetain),
    FAKE_ENTRY(cuCtxSetCurrent), FAKE_ENTRY(cuMemAlloc), FAKE_ENTRY(cuMemcpyHtoD), FAKE_ENTRY(cuMemcpyDtoH),
    FAKE_ENTRY(cuMemcpyDtoDAsync), FAKE_ENTRY(cuMemAddressReserve), FAKE_ENTRY(cuMemAddressFree),
    FAKE_ENTRY(cuMemCreate), FAKE_ENTRY(cuMemRelease), FAKE_ENTRY(cuMemMap), FAKE_ENTRY(cuMemUnmap),
    FAKE_ENTRY(cuMemSetAccess), FAKE_ENTRY(cuMemGetAllocationGranularity), FAKE_ENTRY(cuModuleLoadDataEx),
    FAKE_ENTRY(cuModuleGetFunction), FAKE_ENTRY(cuModuleGetGlobal), FAKE_ENTRY(cuFuncGetAttribute),
    FAKE_ENTRY(cuFuncSetAttribute), FAKE_ENTRY(cuFuncGetParamInfo), FAKE_ENTRY(cuLaunchKernel),
    FAKE_ENTRY(cuLaunchKernelEx), FAKE_ENTRY(cuStreamCreate), FAKE_ENTRY(cuStreamQuery),
    FAKE_ENTRY(cuStreamSynchronize), FAKE_ENTRY(cuEventCreate), FAKE_ENTRY(cuEventRecord),
    FAKE_ENTRY(cuEventElapsedTime),
};

}  // namespace

extern "C" CUresult cuDriverGetVersion(int* version) {
    *version = CUDA_VERSION;
    return CUDA_SUCCESS;
}

extern "C" CUresult cuGetProcAddress_v2(const char* symbol, void** fn, int, cuuint64_t,
                                        CUdriverProcAddressQueryResult* status) {
    auto it = kEntries.find(symbol);
    *fn = it == kEntries.end() ? nullptr : it->second;
    if (status) *status = *fn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return *fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
