// A standalone reproducer of one recorded CUDA kernel launch, written by `mneme export-reproducer`.
//
// It restores the recorded device memory (at the recorded addresses where this process can have
// them), loads the kernel's code, launches it with the recorded launch configuration, times each
// launch with CUDA events and compares the memory afterwards with the recorded epilogue, byte for
// byte. It reads the files of its folder (README.md describes them): launch.txt, regions.txt,
// pointers.txt, memory/prologue.bin, memory/epilogue.bin, kernel.cubin and kernel.ptx.
//
// It needs cuda.h to build and the NVIDIA driver (libcuda.so.1, loaded at run time) to run; no
// Python, no mneme. Build: cmake -S . -B build && cmake --build build, or
//   g++ -O2 -std=c++17 -I/usr/local/cuda/include reproducer.cpp -ldl -o reproducer
//
// Exit status: 0 VERIFIED, 1 MISMATCH, 2 could not run (files, driver, code, launch, a kernel
// fault or timeout), 3 the recorded heap addresses cannot be had in this process and
// --no-relocate was given.

#include <cuda.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if CUDA_VERSION < 12000
#error "the reproducer needs cuda.h of CUDA 12.0 or newer (cuGetProcAddress_v2, cuLaunchKernelEx)"
#endif

#ifndef REPRODUCER_DATA_DIR
#define REPRODUCER_DATA_DIR "."
#endif

namespace {

constexpr int kVerified = 0, kMismatch = 1, kError = 2, kNoAddresses = 3;
constexpr int kFormat = 1;

struct Failure {
    int status;
    std::string message;
};

[[noreturn]] void fail(const std::string& message, int status = kError) { throw Failure{status, message}; }

std::string hex64(uint64_t v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
    return buf;
}

// ------------------------------------------------------------------------------------ driver
// Every entry point comes from libcuda.so.1 through cuGetProcAddress, so building needs no
// driver library (only cuda.h) and the program says why it cannot run where there is no driver.
#define REPRO_DRIVER_FUNCTIONS(X)   \
    X(cuInit)                       \
    X(cuGetErrorName)               \
    X(cuDeviceGetCount)             \
    X(cuDeviceGet)                  \
    X(cuDeviceGetName)              \
    X(cuDeviceGetAttribute)         \
    X(cuDevicePrimaryCtxRetain)     \
    X(cuCtxSetCurrent)              \
    X(cuMemAlloc)                   \
    X(cuMemcpyHtoD)                 \
    X(cuMemcpyDtoH)                 \
    X(cuMemcpyDtoDAsync)            \
    X(cuMemAddressReserve)          \
    X(cuMemAddressFree)             \
    X(cuMemCreate)                  \
    X(cuMemRelease)                 \
    X(cuMemMap)                     \
    X(cuMemUnmap)                   \
    X(cuMemSetAccess)               \
    X(cuMemGetAllocationGranularity) \
    X(cuModuleLoadDataEx)           \
    X(cuModuleGetFunction)          \
    X(cuModuleGetGlobal)            \
    X(cuFuncGetAttribute)           \
    X(cuFuncSetAttribute)           \
    X(cuLaunchKernel)               \
    X(cuLaunchKernelEx)             \
    X(cuStreamCreate)               \
    X(cuStreamQuery)                \
    X(cuStreamSynchronize)          \
    X(cuEventCreate)                \
    X(cuEventRecord)                \
    X(cuEventElapsedTime)

struct Driver {
#define REPRO_DECLARE(name) decltype(&::name) name = nullptr;
    REPRO_DRIVER_FUNCTIONS(REPRO_DECLARE)
#undef REPRO_DECLARE
#if CUDA_VERSION >= 12040
    decltype(&::cuFuncGetParamInfo) cuFuncGetParamInfo = nullptr;  // optional: drivers before 12.4 lack it
#endif
    int version = 0;
};

Driver d;

void load_driver() {
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char* why = dlerror();
        fail(std::string("no NVIDIA driver on this machine: dlopen(\"libcuda.so.1\") failed (") +
             (why ? why : "unknown reason") + "); the reproducer runs where a GPU and its driver are");
    }
    auto get_proc = reinterpret_cast<decltype(&::cuGetProcAddress_v2)>(dlsym(handle, "cuGetProcAddress_v2"));
    auto get_version = reinterpret_cast<decltype(&::cuDriverGetVersion)>(dlsym(handle, "cuDriverGetVersion"));
    if (!get_proc || !get_version)
        fail("the NVIDIA driver is too old: libcuda.so.1 has no cuGetProcAddress_v2 (CUDA 12 drivers have it)");
    if (get_version(&d.version) != CUDA_SUCCESS)
        fail("cuDriverGetVersion failed: the driver installation looks broken");
    int api = std::min(d.version, CUDA_VERSION);
    std::string missing;
    auto resolve = [&](const char* name, void** out, bool required) {
        CUdriverProcAddressQueryResult status{};
        if (get_proc(name, out, api, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS || !*out) {
            *out = nullptr;
            if (required) missing += std::string(missing.empty() ? "" : ", ") + name;
        }
    };
#define REPRO_RESOLVE(name) resolve(#name, reinterpret_cast<void**>(&d.name), true);
    REPRO_DRIVER_FUNCTIONS(REPRO_RESOLVE)
#undef REPRO_RESOLVE
#if CUDA_VERSION >= 12040
    resolve("cuFuncGetParamInfo", reinterpret_cast<void**>(&d.cuFuncGetParamInfo), false);
#endif
    if (!missing.empty())
        fail("the NVIDIA driver (version " + std::to_string(d.version) + ") lacks " + missing + "; update the driver");
}

std::string error_name(CUresult r) {
    const char* name = nullptr;
    if (d.cuGetErrorName && d.cuGetErrorName(r, &name) == CUDA_SUCCESS && name) return name;
    return "CUDA error " + std::to_string(static_cast<int>(r));
}

void check(CUresult r, const std::string& call) {
    if (r != CUDA_SUCCESS) fail(call + " failed: " + error_name(r));
}

// ------------------------------------------------------------------------------------ files
std::string join(const std::string& dir, const std::string& name) { return dir + "/" + name; }

bool exists(const std::string& path) { return access(path.c_str(), R_OK) == 0; }

std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot read " + path);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
}

uint64_t file_size(const std::string& path) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) fail("cannot read " + path);
    return static_cast<uint64_t>(in.tellg());
}

std::vector<uint8_t> read_slice(const std::string& path, uint64_t offset, uint64_t size) {
    std::vector<uint8_t> out(size);
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) fail("cannot read " + path);
    bool ok = fseeko(f, static_cast<off_t>(offset), SEEK_SET) == 0 && std::fread(out.data(), 1, size, f) == size;
    std::fclose(f);
    if (!ok) fail("cannot read " + std::to_string(size) + " bytes at offset " + std::to_string(offset) + " of " + path);
    return out;
}

// One line of a text file: its number, the first word and the rest (trimmed).
struct Line {
    size_t number;
    std::string key, rest;
};

std::vector<Line> read_lines(const std::string& path) {
    std::istringstream in(read_all(path));
    std::vector<Line> out;
    std::string text;
    for (size_t n = 1; std::getline(in, text); ++n) {
        size_t start = text.find_first_not_of(" \t\r");
        if (start == std::string::npos || text[start] == '#') continue;
        size_t end = text.find_last_not_of(" \t\r");
        text = text.substr(start, end - start + 1);
        size_t gap = text.find_first_of(" \t");
        Line line{n, text.substr(0, gap), ""};
        if (gap != std::string::npos) line.rest = text.substr(text.find_first_not_of(" \t", gap));
        out.push_back(line);
    }
    return out;
}

std::vector<std::string> words(const std::string& text) {
    std::istringstream in(text);
    std::vector<std::string> out;
    for (std::string w; in >> w;) out.push_back(w);
    return out;
}

uint64_t number(const std::string& text, const std::string& where) {
    bool hex = text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
    const char* digits = text.c_str() + (hex ? 2 : 0);
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(digits, &end, hex ? 16 : 10);
    if (text.empty() || *digits == '\0' || *digits == '-' || *end != '\0' || errno == ERANGE)
        fail(where + ": '" + text + "' is not a number");
    return v;
}

std::vector<uint8_t> unhex(const std::string& text, const std::string& where) {
    if (text.size() % 2) fail(where + ": odd number of hex digits");
    std::vector<uint8_t> out(text.size() / 2);
    for (size_t i = 0; i < out.size(); ++i) {
        unsigned v = 0;
        for (int k = 0; k < 2; ++k) {
            char c = text[2 * i + k];
            int nibble = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                       : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
            if (nibble < 0) fail(where + ": '" + std::string(1, c) + "' is not a hex digit");
            v = v * 16 + static_cast<unsigned>(nibble);
        }
        out[i] = static_cast<uint8_t>(v);
    }
    return out;
}

std::string tohex(const uint8_t* p, size_t n) {
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (size_t i = 0; i < n; ++i) out += {digits[p[i] >> 4], digits[p[i] & 15]};
    return out;
}

// ------------------------------------------------------------------------------------ the launch
struct Attribute {
    unsigned id;
    std::string name;
    std::vector<uint8_t> value;
};

struct Launch {
    std::string kernel, demangled, static_hash, record_id, code_tier, arch, heap;
    unsigned grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};
    unsigned shared_mem = 0;
    int iterations = 3, warmup = 2, jit_max_registers = 0;
    uint64_t args_size = 0;
    std::vector<uint8_t> args;
    std::vector<Attribute> attributes;
};

void dims(const Line& line, unsigned out[3], const std::string& where) {
    auto w = words(line.rest);
    if (w.size() != 3) fail(where + ": " + line.key + " takes three numbers (x y z)");
    for (int i = 0; i < 3; ++i) {
        uint64_t v = number(w[i], where);
        if (v < 1 || v > 0xffffffffull) fail(where + ": " + line.key + " " + w[i] + " is out of range");
        out[i] = static_cast<unsigned>(v);
    }
}

Launch read_launch(const std::string& dir) {
    const std::string path = join(dir, "launch.txt");
    Launch L;
    int format = 0;
    bool have_args = false;
    for (const Line& line : read_lines(path)) {
        const std::string where = path + " line " + std::to_string(line.number);
        const std::string& k = line.key;
        if (k == "format") format = static_cast<int>(number(line.rest, where));
        else if (k == "kernel") L.kernel = line.rest;
        else if (k == "demangled") L.demangled = line.rest;
        else if (k == "static_hash") L.static_hash = line.rest;
        else if (k == "record_id") L.record_id = line.rest;
        else if (k == "code_tier") L.code_tier = line.rest;
        else if (k == "arch") L.arch = line.rest;
        else if (k == "heap") L.heap = line.rest;
        else if (k == "grid") dims(line, L.grid, where);
        else if (k == "block") dims(line, L.block, where);
        else if (k == "shared_mem") L.shared_mem = static_cast<unsigned>(number(line.rest, where));
        else if (k == "iterations") L.iterations = static_cast<int>(number(line.rest, where));
        else if (k == "warmup") L.warmup = static_cast<int>(number(line.rest, where));
        else if (k == "jit_max_registers") L.jit_max_registers = static_cast<int>(number(line.rest, where));
        else if (k == "args_size") L.args_size = number(line.rest, where);
        else if (k == "args") L.args = unhex(line.rest, where), have_args = true;
        else if (k == "param") {
            if (words(line.rest).size() != 3) fail(where + ": param takes offset, size and kind");
        } else if (k == "attribute") {
            auto w = words(line.rest);
            if (w.size() != 3) fail(where + ": attribute takes id, name and value (hex)");
            L.attributes.push_back({static_cast<unsigned>(number(w[0], where)), w[1], unhex(w[2], where)});
        } else {
            fail(where + ": unknown key '" + k + "'");
        }
    }
    if (format != kFormat)
        fail(path + ": format " + std::to_string(format) + " (this program reads format " +
             std::to_string(kFormat) + ")");
    if (L.kernel.empty() || !L.grid[0] || !L.block[0] || !have_args)
        fail(path + ": kernel, grid, block and args are required");
    if (L.args.size() != L.args_size)
        fail(path + ": args holds " + std::to_string(L.args.size()) + " bytes, args_size says " +
             std::to_string(L.args_size));
    if (L.heap != "fixed" && L.heap != "relocatable") fail(path + ": heap must be fixed or relocatable");
    return L;
}

// ------------------------------------------------------------------------------------ memory
struct Region {
    size_t index;
    std::string kind, policy, name;
    uint64_t base, size, offset;
    bool written;
    bool present = true;     // false: a global the loaded module does not have (pruned by a recompile)
    CUdeviceptr live = 0;    // where it lives in this process
    CUdeviceptr pristine = 0;  // the prologue, on the device, for the resets of written regions

    std::string label() const { return name.empty() ? hex64(base) : name; }
};

enum Where { kPrologue = 0, kEpilogue = 1, kArgs = 2 };

struct Site {
    Where where;
    size_t region;  // unused for args
    uint64_t offset;
    size_t target;
};

std::vector<Region> read_regions(const std::string& dir) {
    const std::string path = join(dir, "regions.txt");
    std::vector<Region> out;
    uint64_t next_offset = 0;
    for (const Line& line : read_lines(path)) {
        const std::string where = path + " line " + std::to_string(line.number);
        auto w = words(line.rest);
        if (w.size() < 7) fail(where + ": expected index kind base size offset written policy name");
        Region r;
        r.index = number(line.key, where);
        r.kind = w[0];
        r.base = number(w[1], where);
        r.size = number(w[2], where);
        r.offset = number(w[3], where);
        r.written = number(w[4], where) != 0;
        r.policy = w[5];
        // The name is the rest of the line after the policy (names may hold spaces); '-' is none.
        std::string rest = line.rest;
        for (int i = 0; i < 6; ++i) {
            rest = rest.substr(rest.find_first_not_of(" \t"));
            rest = rest.substr(rest.find_first_of(" \t"));
        }
        r.name = rest.substr(rest.find_first_not_of(" \t"));
        if (r.name == "-") r.name.clear();
        if (r.index != out.size()) fail(where + ": regions must be numbered 0, 1, 2, ... in order");
        if (r.kind != "heap" && r.kind != "global") fail(where + ": kind must be heap or global");
        if (r.kind == "global" && r.name.empty()) fail(where + ": a global region needs its name");
        if (r.offset != next_offset) fail(where + ": offset " + std::to_string(r.offset) + ", expected " +
                                          std::to_string(next_offset) + " (regions follow each other in the files)");
        if (r.base + r.size < r.base) fail(where + ": the region wraps around the address space");
        next_offset += r.size;
        out.push_back(r);
    }
    return out;
}

std::vector<Site> read_sites(const std::string& dir, const std::vector<Region>& regions, uint64_t args_size) {
    const std::string path = join(dir, "pointers.txt");
    std::vector<Site> out;
    for (const Line& line : read_lines(path)) {
        const std::string where = path + " line " + std::to_string(line.number);
        auto w = words(line.rest);
        if (w.size() != 3) fail(where + ": expected where region offset target");
        Site s;
        if (line.key == "prologue") s.where = kPrologue;
        else if (line.key == "epilogue") s.where = kEpilogue;
        else if (line.key == "args") s.where = kArgs;
        else fail(where + ": the first word must be prologue, epilogue or args");
        s.region = s.where == kArgs ? 0 : number(w[0], where);
        s.offset = number(w[1], where);
        s.target = number(w[2], where);
        uint64_t limit = s.where == kArgs ? args_size : (s.region < regions.size() ? regions[s.region].size : 0);
        if (s.where != kArgs && s.region >= regions.size()) fail(where + ": no region " + w[0]);
        if (s.target >= regions.size()) fail(where + ": no region " + w[2]);
        if (s.offset + 8 > limit) fail(where + ": offset " + w[1] + " is past the end of what it points into");
        out.push_back(s);
    }
    return out;
}

// Rewrite the recorded pointers in `bytes` (a region's or the arguments') for where their targets live now.
void patch(std::vector<uint8_t>& bytes, Where where, size_t region, const std::vector<Site>& sites,
           const std::vector<Region>& regions) {
    for (const Site& s : sites) {
        if (s.where != where || (where != kArgs && s.region != region)) continue;
        const Region& t = regions[s.target];
        uint64_t value;
        std::memcpy(&value, bytes.data() + s.offset, 8);
        if (!t.present || value < t.base || value - t.base >= t.size) continue;
        uint64_t moved = t.live + (value - t.base);
        std::memcpy(bytes.data() + s.offset, &moved, 8);
    }
}

// ------------------------------------------------------------------------------------ placement
struct Mapping {
    CUdeviceptr start;
    size_t size;  // mapped
    CUmemGenericAllocationHandle handle;
    bool mapped;
    size_t reserved;  // the address range reserved from start (at least size)
};

// Reserve [base, base + size) exactly. The driver takes a small request's address only as a hint (it
// hands out a range of its own instead), but grants a large one where asked: try large windows that
// start at base first, then the exact size. 0 when none is granted there.
size_t reserve_at(uint64_t base, size_t size) {
    const size_t GiB = size_t(1) << 30;
    for (size_t want : {std::max(size, 64 * GiB), std::max(size, 16 * GiB), std::max(size, 4 * GiB), size}) {
        CUdeviceptr got = 0;
        if (d.cuMemAddressReserve(&got, want, 0, base, 0) != CUDA_SUCCESS) continue;
        if (got == base) return want;
        d.cuMemAddressFree(got, want);
    }
    return 0;
}

// Reserve and map the pages the heap regions touch at their recorded addresses; "" when done,
// otherwise why not (what was reserved is given back).
std::string place_at_recorded_addresses(std::vector<Region>& regions, CUdevice device, std::vector<Mapping>& maps) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    size_t gran = 0;
    check(d.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity");
    std::vector<std::pair<uint64_t, uint64_t>> pages;  // [start, end), granularity-aligned
    for (const Region& r : regions)
        if (r.kind == "heap" && r.size)
            pages.push_back({r.base / gran * gran, (r.base + r.size + gran - 1) / gran * gran});
    std::sort(pages.begin(), pages.end());
    std::vector<std::pair<uint64_t, uint64_t>> clusters;
    for (const auto& p : pages) {
        if (!clusters.empty() && p.first <= clusters.back().second)
            clusters.back().second = std::max(clusters.back().second, p.second);
        else
            clusters.push_back(p);
    }
    auto give_back = [&]() {
        for (const Mapping& m : maps) {
            if (m.mapped) d.cuMemUnmap(m.start, m.size), d.cuMemRelease(m.handle);
        }
        for (const Mapping& m : maps) {
            if (m.reserved) d.cuMemAddressFree(m.start, m.reserved);
        }
        maps.clear();
    };
    for (const auto& c : clusters) {
        size_t size = c.second - c.first;
        std::string range = hex64(c.first) + "-" + hex64(c.second);
        bool inside = false;  // in a window an earlier cluster reserved: mapped there, nothing more to reserve
        for (const Mapping& m : maps)
            inside = inside || (m.reserved && c.first >= m.start && c.second <= m.start + m.reserved);
        size_t reserved = inside ? 0 : reserve_at(c.first, size);
        if (!inside && !reserved) {
            give_back();
            return "the range " + range + " is taken in this process (the driver did not grant it at its address)";
        }
        maps.push_back({c.first, size, 0, false, reserved});
        Mapping& m = maps.back();
        check(d.cuMemCreate(&m.handle, size, &prop, 0), "cuMemCreate(" + std::to_string(size) + " bytes)");
        check(d.cuMemMap(m.start, size, 0, m.handle, 0), "cuMemMap(" + range + ")");
        m.mapped = true;
        CUmemAccessDesc access{};
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        check(d.cuMemSetAccess(m.start, size, &access, 1), "cuMemSetAccess(" + range + ")");
    }
    for (Region& r : regions)
        if (r.kind == "heap") r.live = r.base;
    return "";
}

// Heap regions anywhere the driver gives memory, keeping each base's address modulo 256.
void relocate_heap(std::vector<Region>& regions) {
    for (Region& r : regions) {
        if (r.kind != "heap" || !r.size) continue;
        CUdeviceptr p = 0;
        check(d.cuMemAlloc(&p, r.size + 256), "cuMemAlloc(" + std::to_string(r.size + 256) + " bytes)");
        r.live = p + ((r.base - p) & 255);
    }
}

// ------------------------------------------------------------------------------------ code
// Keeps the GPU busy while the host enqueues the timed launches, so that the events time the
// kernel and not the host (PTX, so that the driver compiles it for any GPU).
const char* kSpinPtx = R"PTX(
.version 7.0
.target sm_50
.address_size 64

.visible .entry reproducer_spin(
	.param .u64 reproducer_spin_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [reproducer_spin_param_0];
	mov.u64 	%rd2, %globaltimer;
$L__spin:
	mov.u64 	%rd3, %globaltimer;
	sub.s64 	%rd4, %rd3, %rd2;
	setp.lt.u64 	%p1, %rd4, %rd1;
	@%p1 bra 	$L__spin;
	ret;
}
)PTX";

CUresult load_image(CUmodule* module, const std::string& image, int max_registers, std::string* error_log) {
    // The driver wants an 8-byte aligned image; PTX must end with a NUL.
    std::vector<uint64_t> aligned(image.size() / 8 + 1, 0);
    std::memcpy(aligned.data(), image.data(), image.size());
    std::vector<char> log(16384, 0);
    std::vector<CUjit_option> opts = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    std::vector<void*> values = {log.data(), reinterpret_cast<void*>(log.size())};
    if (max_registers > 0) {
        opts.push_back(CU_JIT_MAX_REGISTERS);
        values.push_back(reinterpret_cast<void*>(static_cast<uintptr_t>(max_registers)));
    }
    CUresult r = d.cuModuleLoadDataEx(module, aligned.data(), static_cast<unsigned>(opts.size()), opts.data(),
                                      values.data());
    if (error_log) *error_log = log.data();
    return r;
}

// The kernel's module: kernel.cubin, or kernel.ptx compiled by the driver when the cubin does not
// load on this GPU (or is absent). `what` says which.
CUmodule load_kernel_module(const std::string& dir, const Launch& L, std::string& what) {
    CUmodule module = nullptr;
    std::string cubin = join(dir, "kernel.cubin"), ptx = join(dir, "kernel.ptx");
    std::string why;
    if (exists(cubin)) {
        CUresult r = load_image(&module, read_all(cubin), 0, nullptr);
        if (r == CUDA_SUCCESS) {
            what = "kernel.cubin (" + L.arch + ")";
            return module;
        }
        why = "kernel.cubin (" + L.arch + ") does not load on this GPU (" + error_name(r) + ")";
        if (!exists(ptx)) fail(why + ", and there is no kernel.ptx to compile");
    } else {
        why = "there is no kernel.cubin";
    }
    std::string log;
    CUresult r = load_image(&module, read_all(ptx), L.jit_max_registers, &log);
    if (r != CUDA_SUCCESS)
        fail(why + "; the driver could not compile kernel.ptx either (" + error_name(r) + "): " + log);
    what = "kernel.ptx, compiled by the driver for this GPU: " + why +
           " (the code is the driver's compile of the PTX, not the exported cubin)";
    return module;
}

// ------------------------------------------------------------------------------------ running
struct Options {
    std::string dir;
    int iterations = -1, warmup = -1, device = 0;
    double timeout_s = 60;
    bool check_only = false, no_relocate = false, relocate = false;
};

void usage(FILE* to) {
    std::fprintf(to,
        "usage: reproducer [--dir DIR] [--iterations N] [--warmup N] [--device N] [--timeout S]\n"
        "                  [--no-relocate | --relocate] [--check]\n"
        "Restores the recorded memory, launches the recorded kernel warmup + iterations times (the memory the\n"
        "kernel writes reset before each launch), times each launch with CUDA events, compares the memory\n"
        "after the first and the last launch with the recorded epilogue, byte for byte, and prints VERIFIED\n"
        "or one MISMATCH line per differing region.\n"
        "  --dir DIR        the reproducer's folder (default: the folder it was built from, else .)\n"
        "  --iterations N   timed launches (default: launch.txt's)\n"
        "  --warmup N       launches before them, not in the mean (default: launch.txt's)\n"
        "  --device N       CUDA device ordinal (default 0)\n"
        "  --timeout S      give up when the kernel runs longer than S seconds (default 60; 0: wait)\n"
        "  --no-relocate    exit with status 3 when the recorded heap addresses cannot be had here\n"
        "  --relocate       place the heap anywhere on purpose (pointers into it are rewritten)\n"
        "  --check          read and check the files only; no GPU needed\n"
        "Exit status: 0 VERIFIED, 1 MISMATCH, 2 could not run, 3 addresses unavailable with --no-relocate.\n");
}

Options parse_options(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) fail(a + " needs a value");
            return argv[++i];
        };
        if (a == "--dir") o.dir = value();
        else if (a == "--iterations") o.iterations = static_cast<int>(number(value(), a));
        else if (a == "--warmup") o.warmup = static_cast<int>(number(value(), a));
        else if (a == "--device") o.device = static_cast<int>(number(value(), a));
        else if (a == "--timeout") o.timeout_s = std::atof(value().c_str());
        else if (a == "--no-relocate") o.no_relocate = true;
        else if (a == "--relocate") o.relocate = true;
        else if (a == "--check") o.check_only = true;
        else if (a == "-h" || a == "--help") usage(stdout), std::exit(0);
        else fail("unknown option " + a + " (--help lists them)");
    }
    if (o.no_relocate && o.relocate) fail("--no-relocate and --relocate contradict each other");
    if (o.dir.empty()) o.dir = exists(join(REPRODUCER_DATA_DIR, "launch.txt")) ? REPRODUCER_DATA_DIR : ".";
    return o;
}

void wait_for(CUstream stream, double timeout_s) {
    if (timeout_s <= 0) {
        check(d.cuStreamSynchronize(stream), "waiting for the kernel (cuStreamSynchronize)");
        return;
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
        CUresult r = d.cuStreamQuery(stream);
        if (r == CUDA_SUCCESS) return;
        if (r != CUDA_ERROR_NOT_READY) check(r, "waiting for the kernel (cuStreamQuery)");
        if (std::chrono::steady_clock::now() > deadline) {
            // The kernel still runs: leave without any clean-up, which would wait for it.
            std::fprintf(stderr, "reproducer: error: the kernel did not finish within %g s (--timeout)\n", timeout_s);
            std::fflush(stdout);
            std::fflush(stderr);
            _exit(kError);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

struct RegionFailure {
    uint64_t offset = 0, differing = 0;
    std::vector<int> launches;
    std::string replayed, recorded;
};

// Compare every region's memory with the recorded epilogue; record the failures of `launch`.
void compare(const std::string& epilogue_path, const std::vector<Region>& regions, const std::vector<Site>& sites,
             int launch, std::vector<RegionFailure>& failures) {
    for (const Region& r : regions) {
        if (!r.present || !r.size) continue;
        std::vector<uint8_t> actual(r.size);
        check(d.cuMemcpyDtoH(actual.data(), r.live, r.size), "cuMemcpyDtoH(region " + r.label() + ")");
        std::vector<uint8_t> expected = read_slice(epilogue_path, r.offset, r.size);
        patch(expected, kEpilogue, r.index, sites, regions);
        if (std::memcmp(actual.data(), expected.data(), r.size) == 0) continue;
        RegionFailure& f = failures[r.index];
        uint64_t first = 0, count = 0;
        for (uint64_t i = r.size; i-- > 0;)
            if (actual[i] != expected[i]) first = i, ++count;
        if (f.launches.empty()) {
            uint64_t n = std::min<uint64_t>(16, r.size - first);
            f.offset = first;
            f.differing = count;
            f.replayed = tohex(actual.data() + first, n);
            f.recorded = tohex(expected.data() + first, n);
        }
        f.launches.push_back(launch);
    }
}

int run(const Options& o) {
    const Launch L = read_launch(o.dir);
    std::vector<Region> regions = read_regions(o.dir);
    const std::vector<Site> sites = read_sites(o.dir, regions, L.args_size);
    uint64_t total = regions.empty() ? 0 : regions.back().offset + regions.back().size;
    const std::string prologue_path = join(o.dir, "memory/prologue.bin");
    const std::string epilogue_path = join(o.dir, "memory/epilogue.bin");
    for (const std::string& p : {prologue_path, epilogue_path})
        if (file_size(p) != total)
            fail(p + " holds " + std::to_string(file_size(p)) + " bytes; regions.txt describes " +
                 std::to_string(total));
    const int warmup = o.warmup >= 0 ? o.warmup : L.warmup;
    const int iterations = o.iterations >= 0 ? o.iterations : L.iterations;
    if (iterations < 1) fail("--iterations must be at least 1");
    std::printf("reproducer: kernel %s, record %s\n", L.kernel.c_str(), L.record_id.c_str());
    std::printf("reproducer: grid %ux%ux%u, block %ux%ux%u, dynamic shared memory %u bytes, %zu launch attribute(s)\n",
                L.grid[0], L.grid[1], L.grid[2], L.block[0], L.block[1], L.block[2], L.shared_mem, L.attributes.size());
    std::printf("reproducer: %zu region(s), %" PRIu64 " bytes, %zu pointer site(s)\n", regions.size(), total,
                sites.size());
    if (!exists(join(o.dir, "kernel.cubin")) && !exists(join(o.dir, "kernel.ptx")))
        fail("neither kernel.cubin nor kernel.ptx is in " + o.dir);
    if (o.check_only) {
        std::printf("reproducer: the files are complete and consistent (--check: nothing was run)\n");
        return kVerified;
    }

    // Driver, device, context.
    load_driver();
    check(d.cuInit(0), "cuInit");
    int count = 0;
    check(d.cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (o.device >= count)
        fail("device " + std::to_string(o.device) + " does not exist (" + std::to_string(count) + " visible)");
    CUdevice device;
    check(d.cuDeviceGet(&device, o.device), "cuDeviceGet");
    char name[256] = {0};
    d.cuDeviceGetName(name, sizeof name, device);
    int major = 0, minor = 0;
    d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
    d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
    CUcontext context;
    check(d.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
    check(d.cuCtxSetCurrent(context), "cuCtxSetCurrent");
    std::printf("reproducer: device %d, %s (sm_%d%d), driver %d\n", o.device, name, major, minor, d.version);

    // The heap first, before anything else takes device address space.
    std::vector<Mapping> maps;
    std::string why;
    if (L.heap == "relocatable")
        why = "the recording is relocatable (the recorder could not serve every allocation from its window)";
    else if (o.relocate)
        why = "relocation was asked for (--relocate)";
    else
        why = place_at_recorded_addresses(regions, device, maps);
    bool has_heap =
        std::any_of(regions.begin(), regions.end(), [](const Region& r) { return r.kind == "heap" && r.size; });
    if (!why.empty() && has_heap) {
        if (o.no_relocate)
            fail("the recorded heap cannot be placed at its recorded addresses here (" + why +
                 "), and relocating it was refused (--no-relocate)", kNoAddresses);
        relocate_heap(regions);
        std::printf("reproducer: RELOCATED: the heap is not at its recorded addresses (%s); pointers into it "
                    "(arguments, and 8-byte values in memory listed in pointers.txt) are rewritten\n", why.c_str());
    } else if (has_heap) {
        std::printf("reproducer: heap at its recorded addresses (%zu reservation(s))\n", maps.size());
    }

    // Code.
    std::string code;
    CUmodule module = load_kernel_module(o.dir, L, code);
    std::printf("reproducer: code %s\n", code.c_str());
    CUfunction fn;
    check(d.cuModuleGetFunction(&fn, module, L.kernel.c_str()), "cuModuleGetFunction(" + L.kernel + ")");
    for (Region& r : regions) {
        if (r.kind != "global") continue;
        CUdeviceptr address = 0;
        size_t bytes = 0;
        CUresult res = d.cuModuleGetGlobal(&address, &bytes, module, r.name.c_str());
        if (res != CUDA_SUCCESS) {
            if (L.code_tier == "recorded")
                fail("the module has no global " + r.name + " (" + error_name(res) +
                     "); the code and the memory do not belong together");
            r.present = false;  // pruned by the recompile: the kernel cannot touch it
            std::printf("reproducer: note: the compiled module has no global %s; it is neither restored nor "
                        "compared\n", r.name.c_str());
            continue;
        }
        if (bytes < r.size)
            fail("global " + r.name + " has " + std::to_string(bytes) + " bytes in the module, the recording " +
                 std::to_string(r.size));
        r.live = address;
    }

    // Memory: the prologue in place (pointers rewritten where their targets moved), and a pristine
    // device copy of every region the kernel writes, for the resets between launches.
    for (Region& r : regions) {
        if (!r.present || !r.size) continue;
        std::vector<uint8_t> bytes = read_slice(prologue_path, r.offset, r.size);
        patch(bytes, kPrologue, r.index, sites, regions);
        check(d.cuMemcpyHtoD(r.live, bytes.data(), r.size), "cuMemcpyHtoD(region " + r.label() + ")");
        if (r.written) {
            check(d.cuMemAlloc(&r.pristine, r.size), "cuMemAlloc(pristine copy of " + r.label() + ")");
            check(d.cuMemcpyHtoD(r.pristine, bytes.data(), r.size), "cuMemcpyHtoD(pristine copy of " + r.label() + ")");
        }
    }
    std::vector<uint8_t> args = L.args;
    patch(args, kArgs, 0, sites, regions);

    // The launch as the application made it.
    int max_threads = 0, static_shared = 0, max_dynamic = 0;
    check(d.cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn), "cuFuncGetAttribute");
    check(d.cuFuncGetAttribute(&static_shared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn), "cuFuncGetAttribute");
    check(d.cuFuncGetAttribute(&max_dynamic, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, fn),
          "cuFuncGetAttribute");
    uint64_t threads = uint64_t(L.block[0]) * L.block[1] * L.block[2];
    if (threads > static_cast<uint64_t>(max_threads))
        fail(std::to_string(threads) + " threads per block exceed what this kernel can launch with (" +
             std::to_string(max_threads) + ")");
    if (L.shared_mem + static_cast<unsigned>(static_shared) > 48 * 1024 ||
        L.shared_mem > static_cast<unsigned>(max_dynamic))
        check(d.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(L.shared_mem)),
              "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, " + std::to_string(L.shared_mem) + ")");
    // One pointer per parameter into the recorded bytes (as cudart passes them) where the driver
    // tells the layout, else the bytes as one buffer.
    std::vector<void*> params;
#if CUDA_VERSION >= 12040
    if (d.cuFuncGetParamInfo) {
        for (size_t i = 0;; ++i) {
            size_t offset = 0, size = 0;
            if (d.cuFuncGetParamInfo(fn, i, &offset, &size) != CUDA_SUCCESS) break;
            if (offset + size > args.size()) {
                params.clear();
                break;
            }
            params.push_back(args.data() + offset);
        }
    }
#endif
    size_t args_size = args.size();
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, args.data(), CU_LAUNCH_PARAM_BUFFER_SIZE, &args_size,
                     CU_LAUNCH_PARAM_END};
    void** params_ptr = params.empty() ? nullptr : params.data();
    void** extra_ptr = (!params_ptr && args_size) ? extra : nullptr;
    std::vector<CUlaunchAttribute> attrs(L.attributes.size());
    for (size_t i = 0; i < attrs.size(); ++i) {
        const Attribute& a = L.attributes[i];
        std::memset(&attrs[i], 0, sizeof attrs[i]);
        attrs[i].id = static_cast<CUlaunchAttributeID>(a.id);
        for (size_t k = sizeof(CUlaunchAttributeValue); k < a.value.size(); ++k)
            if (a.value[k])
                fail("launch attribute " + a.name + ": its value is longer than this cuda.h's CUlaunchAttributeValue");
        std::memcpy(&attrs[i].value, a.value.data(), std::min(a.value.size(), sizeof(CUlaunchAttributeValue)));
    }
    CUstream stream;
    check(d.cuStreamCreate(&stream, CU_STREAM_DEFAULT), "cuStreamCreate");
    CUlaunchConfig config{};
    config.gridDimX = L.grid[0], config.gridDimY = L.grid[1], config.gridDimZ = L.grid[2];
    config.blockDimX = L.block[0], config.blockDimY = L.block[1], config.blockDimZ = L.block[2];
    config.sharedMemBytes = L.shared_mem;
    config.hStream = stream;
    config.attrs = attrs.data();
    config.numAttrs = static_cast<unsigned>(attrs.size());
    auto launch = [&]() {
        if (attrs.empty())
            check(d.cuLaunchKernel(fn, L.grid[0], L.grid[1], L.grid[2], L.block[0], L.block[1], L.block[2],
                                   L.shared_mem, stream, params_ptr, extra_ptr),
                  "cuLaunchKernel(" + L.kernel + ")");
        else
            check(d.cuLaunchKernelEx(&config, fn, params_ptr, extra_ptr), "cuLaunchKernelEx(" + L.kernel + ")");
    };
    CUmodule spin_module = nullptr;
    CUfunction spin = nullptr;
    if (load_image(&spin_module, kSpinPtx, 0, nullptr) != CUDA_SUCCESS ||
        d.cuModuleGetFunction(&spin, spin_module, "reproducer_spin") != CUDA_SUCCESS) {
        spin = nullptr;
        std::printf("reproducer: note: the queue-ahead kernel did not load; short kernels' times include the "
                    "host's enqueueing\n");
    }

    // warmup + iterations launches; the written memory reset before each (the kernel may not be
    // idempotent); compared after the first and the last.
    const int launches = warmup + iterations;
    std::vector<CUevent> events(2 * static_cast<size_t>(launches));
    for (CUevent& e : events) check(d.cuEventCreate(&e, CU_EVENT_DEFAULT), "cuEventCreate");
    std::vector<RegionFailure> failures(regions.size());
    auto batch = [&](int first, int count) {
        if (spin) {
            unsigned long long ns = std::min<unsigned long long>(20000ull + 20000ull * count, 10000000ull);
            void* spin_params[] = {&ns};
            check(d.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, spin_params, nullptr),
                  "cuLaunchKernel(queue-ahead)");
        }
        for (int i = first; i < first + count; ++i) {
            if (i > 0)
                for (const Region& r : regions)
                    if (r.present && r.written && r.size)
                        check(d.cuMemcpyDtoDAsync(r.live, r.pristine, r.size, stream),
                              "cuMemcpyDtoDAsync(reset " + r.label() + ")");
            check(d.cuEventRecord(events[2 * i], stream), "cuEventRecord");
            launch();
            check(d.cuEventRecord(events[2 * i + 1], stream), "cuEventRecord");
        }
        wait_for(stream, o.timeout_s);
    };
    batch(0, 1);
    compare(epilogue_path, regions, sites, 1, failures);
    if (launches > 1) {
        batch(1, launches - 1);
        compare(epilogue_path, regions, sites, launches, failures);
    }
    std::vector<double> us;
    for (int i = warmup; i < launches; ++i) {
        float ms = 0;
        check(d.cuEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]), "cuEventElapsedTime");
        us.push_back(ms * 1000.0);
    }

    bool verified = true;
    for (const Region& r : regions) {
        const RegionFailure& f = failures[r.index];
        if (f.launches.empty()) continue;
        verified = false;
        std::string launches_text;
        for (int n : f.launches) launches_text += (launches_text.empty() ? "" : ", ") + std::to_string(n);
        std::printf("MISMATCH region %s offset %" PRIu64 " (region %zu, %s %s, %" PRIu64 " bytes: %" PRIu64
                    " differ after launch %s; replayed %s, recorded %s)\n",
                    r.label().c_str(), f.offset, r.index, r.kind.c_str(), hex64(r.base).c_str(), r.size, f.differing,
                    launches_text.c_str(), f.replayed.c_str(), f.recorded.c_str());
        if (r.policy != "bitwise")
            std::printf("reproducer: note: the recording allows %s for region %s; this program compares byte "
                        "for byte\n",
                        r.policy.c_str(), r.label().c_str());
    }
    if (verified) std::printf("VERIFIED\n");
    double sum = 0, lo = us[0], hi = us[0];
    for (double t : us) sum += t, lo = std::min(lo, t), hi = std::max(hi, t);
    std::printf("time: mean %.3f us (min %.3f, max %.3f) over %d timed launch(es) after %d warm-up, CUDA events\n",
                sum / us.size(), lo, hi, iterations, warmup);
    return verified ? kVerified : kMismatch;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(parse_options(argc, argv));
    } catch (const Failure& f) {
        std::fflush(stdout);
        std::fprintf(stderr, "reproducer: error: %s\n", f.message.c_str());
        return f.status;
    } catch (const std::exception& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "reproducer: error: %s\n", e.what());
        return kError;
    }
}
