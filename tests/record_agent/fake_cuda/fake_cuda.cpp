// A stand-in for libcuda.so.1 and libcupti.so, enough to run the native
// recorder on a machine without a GPU (tests/record/test_fake_driver.py):
// "device" memory is host memory (the recorder's window is reserved and
// mapped with mmap at its fixed address), every stream is a thread running its
// queue in order (kernels, copies, event records), a kernel is a host function
// (the vector add of mneme.format.vecadd_code, whose real cubin the
// application loads, and the recorder's digest kernel), and the CUPTI driver
// API and module-loaded callbacks are issued the way the driver issues them,
// the module-loaded one from inside the load with a module-loading lock held
// (which cuModuleGetFunction, cuModuleGetGlobal, cuFuncLoad and module loads
// also take).
//
// Built twice from this file: -DFAKE_CUPTI gives libcupti.so, which hands the
// subscriber to libcuda.so.1 (fake_cupti_subscribe, fake_cupti_enable).
//
// Also CUDA arrays, texture and surface objects (the calls and CUPTI callbacks that create and
// destroy them, cuMemcpy3D between host, device memory and arrays) and the kernels of
// texture_kernels.cu, run on the host with point reads: a module loaded as PTX text other than the
// recorder's digest kernel is taken to be texture_kernels.cu, and the module-loaded callback hands
// over the cubin FAKE_PTX_CUBIN names, as the driver hands over what its JIT made.
//
// Environment: FAKE_KERNEL_US (each vector add runs this long; default 2000), FAKE_PTX_CUBIN.
#include <cuda.h>
#include <cupti.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#define EXPORT extern "C" __attribute__((visibility("default")))

#ifdef FAKE_CUPTI

extern "C" void fake_cupti_subscribe(CUpti_CallbackFunc cb, void* userdata);
extern "C" void fake_cupti_enable(int domain, int cbid, int enable);

EXPORT CUptiResult cuptiSubscribe(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc callback, void* userdata) {
  *subscriber = reinterpret_cast<CUpti_SubscriberHandle>(0x5ab);
  fake_cupti_subscribe(callback, userdata);
  return CUPTI_SUCCESS;
}
EXPORT CUptiResult cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle, CUpti_CallbackDomain domain,
                                       CUpti_CallbackId cbid) {
  fake_cupti_enable(int(domain), int(cbid), int(enable));
  return CUPTI_SUCCESS;
}
EXPORT CUptiResult cuptiEnableDomain(uint32_t enable, CUpti_SubscriberHandle, CUpti_CallbackDomain domain) {
  fake_cupti_enable(int(domain), -1, int(enable));
  return CUPTI_SUCCESS;
}

#else  // libcuda.so.1

namespace {

CUpti_CallbackFunc g_cb = nullptr;
void* g_userdata = nullptr;
std::mutex g_enable_mu;
std::set<std::pair<int, int>> g_enabled;  // (domain, cbid); cbid -1: the whole domain
std::atomic<uint32_t> g_correlation{0};
CUcontext const kContext = reinterpret_cast<CUcontext>(0xc0ffee);

bool enabled(int domain, int cbid) {
  std::lock_guard<std::mutex> lock(g_enable_mu);
  return g_cb && (g_enabled.count({domain, cbid}) || g_enabled.count({domain, -1}));
}

struct ApiCall {
  CUpti_CallbackId id;
  const char* name;
  const void* params;
  const char* symbol;
  bool on;
  uint64_t correlation = 0;
  uint32_t correlation_id;
  ApiCall(CUpti_CallbackId id_, const char* name_, const void* params_, const char* symbol_ = nullptr)
      : id(id_), name(name_), params(params_), symbol(symbol_), on(enabled(CUPTI_CB_DOMAIN_DRIVER_API, int(id_))),
        correlation_id(++g_correlation) {
    issue(CUPTI_API_ENTER, nullptr);
  }
  void issue(CUpti_ApiCallbackSite site, CUresult* result) {
    if (!on) return;
    CUpti_CallbackData d{};
    d.callbackSite = site;
    d.functionName = name;
    d.functionParams = params;
    d.functionReturnValue = result;
    d.symbolName = symbol;
    d.context = kContext;
    d.correlationData = &correlation;
    d.correlationId = correlation_id;
    g_cb(g_userdata, CUPTI_CB_DOMAIN_DRIVER_API, id, &d);
  }
  CUresult done(CUresult r) {
    issue(CUPTI_API_EXIT, &r);
    return r;
  }
};

// ---- streams: one thread each, running its queue in order --------------------

struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  uint64_t submitted = 0, completed = 0;
  Stream() {
    std::thread([this] {
      std::unique_lock<std::mutex> lock(mu);
      for (;;) {
        cv.wait(lock, [&] { return !queue.empty(); });
        auto op = std::move(queue.front());
        queue.pop_front();
        lock.unlock();
        op();
        lock.lock();
        ++completed;
        cv.notify_all();
      }
    }).detach();
  }
  uint64_t push(std::function<void()> op) {
    std::lock_guard<std::mutex> lock(mu);
    queue.push_back(std::move(op));
    cv.notify_all();
    return ++submitted;
  }
  void wait_for(uint64_t mark) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return completed >= mark; });
  }
  uint64_t mark() {
    std::lock_guard<std::mutex> lock(mu);
    return submitted;
  }
};

std::mutex g_streams_mu;
std::vector<Stream*>& streams() {
  static auto* s = new std::vector<Stream*>();
  return *s;
}
Stream* default_stream() {
  static Stream* s = [] {
    auto* st = new Stream();
    std::lock_guard<std::mutex> lock(g_streams_mu);
    streams().push_back(st);
    return st;
  }();
  return s;
}
Stream* stream_of(CUstream s) {
  if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return default_stream();
  return reinterpret_cast<Stream*>(s);
}

struct Event {
  Stream* stream = nullptr;
  uint64_t mark = 0;
};

// ---- modules and functions --------------------------------------------------

std::mutex g_loader;  // the module-loading lock: held while the module-loaded callback runs
std::atomic<uint32_t> g_module_ids{0};

enum class Kind { vecadd, digest, sample, table, unknown };
struct Module {
  uint32_t id = 0;
  bool digest = false;
};
struct Function {
  Kind kind = Kind::unknown;
  Module* module = nullptr;
  const char* name = "";
};

long kernel_us() {
  static long us = [] {
    const char* v = std::getenv("FAKE_KERNEL_US");
    return v ? std::atol(v) : 2000L;
  }();
  return us;
}

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

// The recorder's digest kernel (digest_kernel.cu): per piece of the table, 16
// sub-blocks of 1 MiB, two lanes each; any function of the bytes will do.
void digest_kernel(const unsigned long long* table, unsigned long long* results, unsigned pieces) {
  constexpr uint64_t kSub = 1ull << 20;
  for (unsigned i = 0; i < pieces; ++i) {
    const auto* base = reinterpret_cast<const unsigned char*>(table[2 * i]);
    const uint64_t size = table[2 * i + 1];
    for (unsigned s = 0; s < 16; ++s) {
      uint64_t lo = 0x1234 + s, hi = 0x5678 + s;
      for (uint64_t off = s * kSub; off < size && off < (s + 1) * kSub; off += 8) {
        uint64_t w = 0;
        std::memcpy(&w, base + off, std::min<uint64_t>(8, size - off));
        lo = mix(lo, w ^ off);
        hi = mix(hi, w + off);
      }
      results[(i * 16 + s) * 2] = lo;
      results[(i * 16 + s) * 2 + 1] = hi;
    }
  }
}

// CUDA arrays (contents as packed rows) and texture and surface objects (handles 1, 2, ... per kind,
// as small as the real driver's).
struct FakeArray {
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  size_t row = 0, rows = 1;
  std::vector<unsigned char> data;
};
struct FakeObject {
  bool surface = false;
  CUDA_RESOURCE_DESC resource{};
};
std::mutex g_objects_mu;
std::map<uint64_t, FakeObject> g_objects[2];  // textures, surfaces
uint64_t g_next_object[2] = {1, 1};

FakeObject object(bool surface, uint64_t handle) {
  std::lock_guard<std::mutex> lock(g_objects_mu);
  return g_objects[surface][handle];
}

// Where byte x of row y of slice z is, for one side of a cuMemcpy3D.
unsigned char* locate(CUmemorytype type, const void* host, CUdeviceptr device, CUarray array, size_t pitch,
                      size_t height, size_t x, size_t y, size_t z) {
  if (type == CU_MEMORYTYPE_ARRAY) {
    auto* a = reinterpret_cast<FakeArray*>(array);
    return a->data.data() + x + y * a->row + z * a->row * a->rows;
  }
  auto* base = type == CU_MEMORYTYPE_HOST ? static_cast<unsigned char*>(const_cast<void*>(host))
                                          : reinterpret_cast<unsigned char*>(device);
  return base + x + y * pitch + z * pitch * height;
}

void copy3d(const CUDA_MEMCPY3D& p) {
  for (size_t z = 0; z < p.Depth; ++z)
    for (size_t y = 0; y < p.Height; ++y)
      std::memcpy(locate(p.dstMemoryType, p.dstHost, p.dstDevice, p.dstArray, p.dstPitch, p.dstHeight, p.dstXInBytes,
                         p.dstY + y, p.dstZ + z),
                  locate(p.srcMemoryType, p.srcHost, p.srcDevice, p.srcArray, p.srcPitch, p.srcHeight, p.srcXInBytes,
                         p.srcY + y, p.srcZ + z),
                  p.WidthInBytes);
}

float* texel(const FakeObject& o, size_t x, size_t y) {
  if (o.resource.resType == CU_RESOURCE_TYPE_LINEAR) return reinterpret_cast<float*>(o.resource.res.linear.devPtr) + x;
  auto* a = reinterpret_cast<FakeArray*>(o.resource.res.array.hArray);
  return reinterpret_cast<float*>(a->data.data() + y * a->row) + x;
}

std::map<uint64_t, size_t>& allocations() {  // the driver's own allocations (not the window)
  static auto* m = new std::map<uint64_t, size_t>();
  return *m;
}
std::mutex g_alloc_mu;

void* map_anywhere(size_t n) {
  void* p = mmap(nullptr, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

}  // namespace

EXPORT void fake_cupti_subscribe(CUpti_CallbackFunc cb, void* userdata) {
  g_userdata = userdata;
  g_cb = cb;
}

EXPORT void fake_cupti_enable(int domain, int cbid, int enable) {
  std::lock_guard<std::mutex> lock(g_enable_mu);
  if (enable) g_enabled.insert({domain, cbid});
  else g_enabled.erase({domain, cbid});
}

EXPORT CUresult cuInit(unsigned int) {
  static std::once_flag once;
  std::call_once(once, [] {
    if (const char* path = std::getenv("CUDA_INJECTION64_PATH")) {
      if (void* h = dlopen(path, RTLD_NOW | RTLD_GLOBAL)) {
        if (auto init = reinterpret_cast<int (*)()>(dlsym(h, "InitializeInjection"))) init();
      }
    }
  });
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int* v) {
  *v = 13000;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGetProcAddress_v2(const char*, void** pfn, int, cuuint64_t, CUdriverProcAddressQueryResult* status) {
  if (pfn) *pfn = nullptr;
  if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}
EXPORT CUresult cuGetErrorString(CUresult r, const char** s) {
  static thread_local char buf[32];
  std::snprintf(buf, sizeof buf, "fake error %d", int(r));
  *s = buf;
  return CUDA_SUCCESS;
}

// ---- context and device ---------------------------------------------------------

EXPORT CUresult cuCtxGetCurrent(CUcontext* c) {
  *c = kContext;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSetCurrent(CUcontext) { return CUDA_SUCCESS; }
EXPORT CUresult cuCtxGetDevice(CUdevice* d) {
  *d = 0;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSynchronize() {
  std::vector<std::pair<Stream*, uint64_t>> marks;
  {
    std::lock_guard<std::mutex> lock(g_streams_mu);
    for (Stream* s : streams()) marks.emplace_back(s, s->mark());
  }
  for (auto& [s, m] : marks) s->wait_for(m);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice) {
  *v = a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ? 9 : 0;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice) {
  std::snprintf(name, size_t(len), "Fake GPU");
  return CUDA_SUCCESS;
}

// ---- streams and events ---------------------------------------------------------

EXPORT CUresult cuStreamCreate(CUstream* s, unsigned int) {
  auto* st = new Stream();
  {
    std::lock_guard<std::mutex> lock(g_streams_mu);
    streams().push_back(st);
  }
  *s = reinterpret_cast<CUstream>(st);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamDestroy_v2(CUstream) { return CUDA_SUCCESS; }
EXPORT CUresult cuStreamSynchronize(CUstream s) {
  Stream* st = stream_of(s);
  st->wait_for(st->mark());
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamIsCapturing(CUstream, CUstreamCaptureStatus* status) {
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuEventCreate(CUevent* e, unsigned int) {
  *e = reinterpret_cast<CUevent>(new Event());
  return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
  auto* ev = reinterpret_cast<Event*>(e);
  ev->stream = stream_of(s);
  ev->mark = ev->stream->push([] {});
  return CUDA_SUCCESS;
}
EXPORT CUresult cuEventSynchronize(CUevent e) {
  auto* ev = reinterpret_cast<Event*>(e);
  if (ev->stream) ev->stream->wait_for(ev->mark);
  return CUDA_SUCCESS;
}

// ---- memory ------------------------------------------------------------------------

EXPORT CUresult cuMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) {
  *g = 2u << 20;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t, CUdeviceptr addr, unsigned long long) {
  void* p = mmap(reinterpret_cast<void*>(addr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE |
                 (addr ? MAP_FIXED_NOREPLACE : 0), -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  *ptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  munmap(reinterpret_cast<void*>(ptr), size);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* h, size_t, const CUmemAllocationProp*, unsigned long long) {
  *h = 1;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle) { return CUDA_SUCCESS; }
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t, CUmemGenericAllocationHandle, unsigned long long) {
  return mprotect(reinterpret_cast<void*>(ptr), size, PROT_READ | PROT_WRITE) == 0 ? CUDA_SUCCESS
                                                                                 : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) { return CUDA_SUCCESS; }

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
  void* m = map_anywhere(n);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = reinterpret_cast<CUdeviceptr>(m);
  std::lock_guard<std::mutex> lock(g_alloc_mu);
  allocations()[*p] = n;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  cuMemFree_v2_params params{p};
  ApiCall call(CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2, "cuMemFree_v2", &params);
  std::lock_guard<std::mutex> lock(g_alloc_mu);
  auto it = allocations().find(p);
  if (it == allocations().end()) return call.done(CUDA_ERROR_INVALID_VALUE);
  munmap(reinterpret_cast<void*>(p), it->second ? it->second : 1);
  allocations().erase(it);
  return call.done(CUDA_SUCCESS);
}
EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  std::lock_guard<std::mutex> lock(g_alloc_mu);
  auto it = allocations().upper_bound(p);
  if (it == allocations().begin()) return CUDA_ERROR_NOT_FOUND;
  --it;
  if (p >= it->first + it->second) return CUDA_ERROR_NOT_FOUND;
  if (base) *base = it->first;
  if (size) *size = it->second;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr* p, size_t n, unsigned int flags) {
  cuMemAllocManaged_params params{p, n, flags};
  ApiCall call(CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged, "cuMemAllocManaged", &params);
  void* m = map_anywhere(n);
  if (!m) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  *p = reinterpret_cast<CUdeviceptr>(m);
  {
    std::lock_guard<std::mutex> lock(g_alloc_mu);
    allocations()[*p] = n;
  }
  return call.done(CUDA_SUCCESS);
}
EXPORT CUresult cuMemAllocHost_v2(void** p, size_t n) {
  *p = map_anywhere(n);
  return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
EXPORT CUresult cuMemFreeHost(void*) { return CUDA_SUCCESS; }
EXPORT CUresult cuMemHostRegister_v2(void*, size_t, unsigned int) { return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  stream_of(s)->push([=] { std::memcpy(dst, reinterpret_cast<const void*>(src), n); });
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  // The source may be reused once the call returns (the digest table is): copy it now.
  auto copy = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                           static_cast<const unsigned char*>(src) + n);
  stream_of(s)->push([=] { std::memcpy(reinterpret_cast<void*>(dst), copy->data(), n); });
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  cuCtxSynchronize();
  std::memcpy(reinterpret_cast<void*>(dst), src, n);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  cuCtxSynchronize();
  std::memcpy(dst, reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr, size_t, CUmemLocation, unsigned int, CUstream s) {
  stream_of(s)->push([] {});
  return CUDA_SUCCESS;
}

// ---- modules, functions, launches -----------------------------------------------------

EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  cuModuleLoadData_params params{module, image};
  ApiCall call(CUPTI_DRIVER_TRACE_CBID_cuModuleLoadData, "cuModuleLoadData", &params);
  std::lock_guard<std::mutex> loading(g_loader);
  auto* m = new Module();
  m->id = ++g_module_ids;
  const auto* bytes = static_cast<const unsigned char*>(image);
  const bool elf = bytes[0] == 0x7f && bytes[1] == 'E' && bytes[2] == 'L' && bytes[3] == 'F';
  // The recorder's digest kernel comes as PTX text; other PTX is texture_kernels.cu, "compiled" into the
  // cubin FAKE_PTX_CUBIN names.
  m->digest = !elf && std::strstr(static_cast<const char*>(image), "mneme_snapshot_digest");
  std::vector<unsigned char> jit;
  if (!elf && !m->digest) {
    const char* path = std::getenv("FAKE_PTX_CUBIN");
    FILE* f = path ? std::fopen(path, "rb") : nullptr;
    if (!f) return call.done(CUDA_ERROR_INVALID_PTX);
    int c;
    while ((c = std::fgetc(f)) != EOF) jit.push_back(static_cast<unsigned char>(c));
    std::fclose(f);
    bytes = jit.data();
  }
  if ((elf || !jit.empty()) && enabled(CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED)) {
    size_t size = 0;  // the ELF header's section table ends the file (as in the vector add's cubin)
    uint64_t shoff;
    uint16_t shentsize, shnum;
    std::memcpy(&shoff, bytes + 0x28, 8);
    std::memcpy(&shentsize, bytes + 0x3a, 2);
    std::memcpy(&shnum, bytes + 0x3c, 2);
    size = shoff + uint64_t(shentsize) * shnum;
    CUpti_ModuleResourceData md{};
    md.moduleId = m->id;
    md.cubinSize = size;
    md.pCubin = reinterpret_cast<const char*>(bytes);
    CUpti_ResourceData rd{};
    rd.context = kContext;
    rd.resourceDescriptor = &md;
    g_cb(g_userdata, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED, &rd);
  }
  *module = reinterpret_cast<CUmodule>(m);
  return call.done(CUDA_SUCCESS);
}
EXPORT CUresult cuModuleGetFunction(CUfunction* f, CUmodule mod, const char* name) {
  std::lock_guard<std::mutex> loading(g_loader);
  auto* fn = new Function();
  fn->module = reinterpret_cast<Module*>(mod);
  if (std::strcmp(name, "mneme_snapshot_digest") == 0) fn->kind = Kind::digest, fn->name = "mneme_snapshot_digest";
  else if (std::strcmp(name, "_Z6vecaddPKfS0_Pfi") == 0) fn->kind = Kind::vecadd, fn->name = "_Z6vecaddPKfS0_Pfi";
  else if (std::strcmp(name, "_Z6sampleyyyPfi") == 0) fn->kind = Kind::sample, fn->name = "_Z6sampleyyyPfi";
  else if (std::strcmp(name, "_Z5tablePKyPfi") == 0) fn->kind = Kind::table, fn->name = "_Z5tablePKyPfi";
  else return CUDA_ERROR_NOT_FOUND;
  *f = reinterpret_cast<CUfunction>(fn);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr*, size_t*, CUmodule, const char*) {
  std::lock_guard<std::mutex> loading(g_loader);
  return CUDA_ERROR_NOT_FOUND;
}
EXPORT CUresult cuFuncGetName(const char** name, CUfunction f) {
  *name = reinterpret_cast<Function*>(f)->name;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuFuncGetModule(CUmodule* m, CUfunction f) {
  *m = reinterpret_cast<CUmodule>(reinterpret_cast<Function*>(f)->module);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuFuncLoad(CUfunction) {
  std::lock_guard<std::mutex> loading(g_loader);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuFuncGetParamInfo(CUfunction f, size_t i, size_t* off, size_t* size) {
  static const std::vector<std::pair<size_t, size_t>> vecadd = {{0, 8}, {8, 8}, {16, 8}, {24, 4}},
                                                       digest = {{0, 8}, {8, 8}},
                                                       sample = {{0, 8}, {8, 8}, {16, 8}, {24, 8}, {32, 4}},
                                                       table = {{0, 8}, {8, 8}, {16, 4}};
  const Kind kind = reinterpret_cast<Function*>(f)->kind;
  const auto& layout = kind == Kind::vecadd ? vecadd : kind == Kind::sample ? sample : kind == Kind::table ? table
                                                                                                        : digest;
  if (i >= layout.size()) return CUDA_ERROR_INVALID_VALUE;
  *off = layout[i].first;
  *size = layout[i].second;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shared, CUstream s, void** params, void** extra) {
  auto* fn = reinterpret_cast<Function*>(f);
  cuLaunchKernel_params p{f, gx, gy, gz, bx, by, bz, shared, s, params, extra};
  ApiCall call(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, "cuLaunchKernel", &p, fn->name);
  if (fn->kind == Kind::vecadd) {
    const float* a = *static_cast<const float**>(params[0]);
    const float* b = *static_cast<const float**>(params[1]);
    float* c = *static_cast<float**>(params[2]);
    int n = *static_cast<int*>(params[3]);
    stream_of(s)->push([=] {
      std::this_thread::sleep_for(std::chrono::microseconds(kernel_us()));
      for (int i = 0; i < n; ++i) c[i] = a[i] + b[i];
    });
  } else if (fn->kind == Kind::sample) {  // texture_kernels.cu: sample(linear, image, canvas, out, n)
    const FakeObject linear = object(false, *static_cast<uint64_t*>(params[0]));
    const FakeObject image = object(false, *static_cast<uint64_t*>(params[1]));
    const FakeObject canvas = object(true, *static_cast<uint64_t*>(params[2]));
    float* out = *static_cast<float**>(params[3]);
    const int n = *static_cast<int*>(params[4]);
    stream_of(s)->push([=] {
      for (int i = 0; i < n; ++i) {
        const size_t x = size_t(i % 16), y = size_t(i / 16 % 8);
        out[i] = *texel(linear, size_t(i), 0) + *texel(image, x, y);
        *texel(canvas, x, y) = out[i];
      }
    });
  } else if (fn->kind == Kind::table) {  // table(handles, out, n)
    const uint64_t* handles = *static_cast<const uint64_t**>(params[0]);
    float* out = *static_cast<float**>(params[1]);
    const int n = *static_cast<int*>(params[2]);
    stream_of(s)->push([=] {
      const FakeObject linear = object(false, handles[0]);
      for (int i = 0; i < n; ++i) out[i] = 2.0f * *texel(linear, size_t(i), 0);
    });
  } else if (fn->kind == Kind::digest) {
    auto* table = *static_cast<const unsigned long long**>(params[0]);
    auto* results = *static_cast<unsigned long long**>(params[1]);
    stream_of(s)->push([=] { digest_kernel(table, results, gy); });
  } else {
    return call.done(CUDA_ERROR_INVALID_HANDLE);
  }
  return call.done(CUDA_SUCCESS);
}

// ---- CUDA arrays, texture and surface objects ------------------------------------------------

EXPORT CUresult cuArray3DCreate_v2(CUarray* out, const CUDA_ARRAY3D_DESCRIPTOR* desc) {
  cuArray3DCreate_v2_params params{out, desc};
  ApiCall call(CUPTI_DRIVER_TRACE_CBID_cuArray3DCreate_v2, "cuArray3DCreate_v2", &params);
  if (desc->Format != CU_AD_FORMAT_FLOAT) return call.done(CUDA_ERROR_INVALID_VALUE);  // floats only here
  auto* a = new FakeArray();
  a->desc = *desc;
  a->row = desc->Width * 4 * desc->NumChannels;
  a->rows = desc->Height ? desc->Height : 1;
  a->data.assign(a->row * a->rows * (desc->Depth ? desc->Depth : 1), 0);
  *out = reinterpret_cast<CUarray>(a);
  return call.done(CUDA_SUCCESS);
}
EXPORT CUresult cuArrayDestroy(CUarray array) {
  cuArrayDestroy_params params{array};
  ApiCall call(CUPTI_DRIVER_TRACE_CBID_cuArrayDestroy, "cuArrayDestroy", &params);
  cuCtxSynchronize();
  delete reinterpret_cast<FakeArray*>(array);
  return call.done(CUDA_SUCCESS);
}
EXPORT CUresult cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR* desc, CUarray array) {
  *desc = reinterpret_cast<FakeArray*>(array)->desc;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D* p) {
  cuCtxSynchronize();
  copy3d(*p);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D* p, CUstream s) {
  const CUDA_MEMCPY3D copy = *p;  // device memory and arrays only (host sources may go once this returns)
  stream_of(s)->push([copy] { copy3d(copy); });
  return CUDA_SUCCESS;
}
uint64_t add_object(bool surface, const CUDA_RESOURCE_DESC* resource) {
  std::lock_guard<std::mutex> lock(g_objects_mu);
  const uint64_t handle = g_next_object[surface]++;
  g_objects[surface][handle] = FakeObject{surface, *resource};
  return handle;
}
void remove_object(bool surface, uint64_t handle) {
  std::lock_guard<std::mutex> lock(g_objects_mu);
  g_objects[surface].erase(handle);
}
EXPORT CUresult cuTexObjectCreate(CUtexObject* out, const CUDA_RESOURCE_DESC* resource,
                                  const CUDA_TEXTURE_DESC* texture, const CUDA_RESOURCE_VIEW_DESC* view) {
  cuTexObjectCreate_params params{out, resource, texture, view};
  ApiCall call(CUPTI_DRIVER_TRACE_CBID_cuTexObjectCreate, "cuTexObjectCreate", &params);
  *out = add_object(false, resource);
  return call.done(CUDA_SUCCESS);
}
EXPORT CUresult cuTexObjectDestroy(CUtexObject handle) {
  cuTexObjectDestroy_params params{handle};
  ApiCall call(CUPTI_DRIVER_TRACE_CBID_cuTexObjectDestroy, "cuTexObjectDestroy", &params);
  remove_object(false, handle);
  return call.done(CUDA_SUCCESS);
}
EXPORT CUresult cuSurfObjectCreate(CUsurfObject* out, const CUDA_RESOURCE_DESC* resource) {
  cuSurfObjectCreate_params params{out, resource};
  ApiCall call(CUPTI_DRIVER_TRACE_CBID_cuSurfObjectCreate, "cuSurfObjectCreate", &params);
  *out = add_object(true, resource);
  return call.done(CUDA_SUCCESS);
}
EXPORT CUresult cuSurfObjectDestroy(CUsurfObject handle) {
  cuSurfObjectDestroy_params params{handle};
  ApiCall call(CUPTI_DRIVER_TRACE_CBID_cuSurfObjectDestroy, "cuSurfObjectDestroy", &params);
  remove_object(true, handle);
  return call.done(CUDA_SUCCESS);
}

#endif
