// CUPTI activity timing (see cupti_timer.hpp).
#include "cupti_timer.hpp"

#include "driver.hpp"

#include <cupti.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <stdexcept>

namespace mneme {
namespace {

struct Cupti {
    decltype(&::cuptiActivityEnable) enable = nullptr;
    decltype(&::cuptiActivityDisable) disable = nullptr;
    decltype(&::cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
    decltype(&::cuptiActivityFlushAll) flush_all = nullptr;
    decltype(&::cuptiActivityGetNextRecord) next_record = nullptr;
    decltype(&::cuptiGetStreamIdEx) stream_id = nullptr;
    decltype(&::cuptiGetResultString) result_string = nullptr;
    std::string reason;  // empty when usable
    bool registered = false;
};

struct KernelRecord {
    uint32_t stream;
    uint64_t start, end;
    std::string name;
};

std::mutex g_lock;
std::vector<KernelRecord> g_records;
constexpr size_t kBufferSize = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferSize));
    *size = *buffer ? kBufferSize : 0;
    *max_records = 0;
}

Cupti& cupti();

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    CUpti_Activity* record = nullptr;
    std::lock_guard<std::mutex> hold(g_lock);
    while (valid && cupti().next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(record);
            g_records.push_back({k->streamId, k->start, k->end, k->name ? k->name : ""});
        }
    }
    std::free(buffer);
}

void* open_library() {
    std::vector<std::string> names;
    if (const char* env = std::getenv("MNEME_CUPTI_LIB")) names.push_back(env);
    names.push_back("libcupti.so.13");
    names.push_back("libcupti.so");
    for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
        if (const char* root = std::getenv(var)) {
            for (const char* sub : {"/lib64/libcupti.so", "/lib/libcupti.so", "/extras/CUPTI/lib64/libcupti.so"})
                names.push_back(std::string(root) + sub);
        }
    }
    for (const char* path : {"/usr/local/cuda/lib64/libcupti.so", "/usr/local/cuda/lib/libcupti.so",
                             "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so"})
        names.push_back(path);
    for (const auto& name : names)
        if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    return nullptr;
}

Cupti load() {
    Cupti c;
    void* h = open_library();
    if (!h) {
        c.reason = "libcupti not found (set MNEME_CUPTI_LIB, or CUDA_HOME to a toolkit that has it)";
        return c;
    }
    c.enable = reinterpret_cast<decltype(c.enable)>(dlsym(h, "cuptiActivityEnable"));
    c.disable = reinterpret_cast<decltype(c.disable)>(dlsym(h, "cuptiActivityDisable"));
    c.register_callbacks = reinterpret_cast<decltype(c.register_callbacks)>(dlsym(h, "cuptiActivityRegisterCallbacks"));
    c.flush_all = reinterpret_cast<decltype(c.flush_all)>(dlsym(h, "cuptiActivityFlushAll"));
    c.next_record = reinterpret_cast<decltype(c.next_record)>(dlsym(h, "cuptiActivityGetNextRecord"));
    c.stream_id = reinterpret_cast<decltype(c.stream_id)>(dlsym(h, "cuptiGetStreamIdEx"));
    c.result_string = reinterpret_cast<decltype(c.result_string)>(dlsym(h, "cuptiGetResultString"));
    if (!c.enable || !c.disable || !c.register_callbacks || !c.flush_all || !c.next_record || !c.stream_id || !c.result_string)
        c.reason = "libcupti lacks the activity API entry points the engine needs (CUPTI from CUDA 12.x or newer)";
    return c;
}

Cupti& cupti() {
    static Cupti* instance = new Cupti(load());  // lives as long as the process (CUPTI calls back into it)
    return *instance;
}

void check_cupti(CUptiResult r, const char* call) {
    if (r == CUPTI_SUCCESS) return;
    const char* text = nullptr;
    cupti().result_string(r, &text);
    throw std::runtime_error(std::string(call) + " failed: " + (text ? text : "unknown CUPTI error"));
}

}  // namespace

std::string cupti_unavailable_reason() { return cupti().reason; }

void* cupti_library() {
    static void* handle = open_library();  // the same handle load() got: dlopen() counts references
    return handle;
}

void cupti_begin() {
    Cupti& c = cupti();
    if (!c.reason.empty()) throw std::runtime_error("CUPTI timing is not available: " + c.reason);
    {
        std::lock_guard<std::mutex> hold(g_lock);
        g_records.clear();
    }
    if (!c.registered) {
        check_cupti(c.register_callbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
        c.registered = true;
    }
    // On only while a CUPTI-timed run needs it: collection slows every launch of the process down.
    check_cupti(c.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)");
}

std::vector<std::pair<uint64_t, uint64_t>> cupti_collect(CUcontext context, CUstream stream, const std::string& kernel) {
    Cupti& c = cupti();
    uint32_t stream_id = 0;
    check_cupti(c.stream_id(context, stream, 0, &stream_id), "cuptiGetStreamIdEx");
    check_cupti(c.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityDisable(CONCURRENT_KERNEL)");
    check_cupti(c.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
    std::vector<std::pair<uint64_t, uint64_t>> out;
    std::lock_guard<std::mutex> hold(g_lock);
    for (const auto& r : g_records)
        if (r.stream == stream_id && r.name == kernel) out.emplace_back(r.start, r.end);
    std::sort(out.begin(), out.end());
    g_records.clear();
    return out;
}

}  // namespace mneme
