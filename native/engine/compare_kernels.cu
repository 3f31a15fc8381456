// Device-side comparison kernels of the replay engine.
//
// Compiled to PTX at build time (nvcc -ptx) and embedded in the engine as text,
// then JIT-loaded by the driver in each context: verification runs on the GPU
// beside the expected epilogue, so a replay copies nothing back unless a report
// needs it. The kernels only gather statistics; what counts as a pass (the
// tolerance policy) is decided in Python.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

// Statistics slots written by the tolerance kernels (doubles, then counters).
// Keep in sync with mneme/replay/engine_stats.py.
enum {
    S_SUM_ABS_DIFF = 0,   // sum |a-b|
    S_SUM_SQ_DIFF = 1,    // sum (a-b)^2
    S_MAX_ABS_DIFF = 2,   // max |a-b| (stored as ordered bits)
    S_SUM_ABS_REF = 3,    // sum |b|
    S_SUM_SQ_REF = 4,     // sum b^2
    S_MAX_ABS_REF = 5,    // max |b| (stored as ordered bits)
    S_MAX_REL_DIFF = 6,   // max |a-b|/|b| over elements with b != 0 (ordered bits)
    N_DOUBLE_STATS = 7,
};
enum {
    C_VIOLATIONS = 0,     // elements outside the elementwise threshold
    C_FIRST_VIOLATION = 1,// smallest violating element index (atomicMin; ~0 when none)
    C_NAN_MISMATCH = 2,   // elements where exactly one side is NaN
    N_COUNTERS = 3,
};

__device__ __forceinline__ void atomic_max_nonneg(double* slot, double v) {
    // Non-negative doubles order like their bit patterns.
    atomicMax(reinterpret_cast<unsigned long long*>(slot), __double_as_longlong(v));
}

template <typename T> __device__ __forceinline__ double to_double(T v) { return static_cast<double>(v); }
template <> __device__ __forceinline__ double to_double<__half>(__half v) { return static_cast<double>(__half2float(v)); }
template <> __device__ __forceinline__ double to_double<__nv_bfloat16>(__nv_bfloat16 v) { return static_cast<double>(__bfloat162float(v)); }


// Bytewise comparison: count of differing bytes and the first differing offset.
// out[0] = differing bytes, out[1] = first differing offset (atomicMin, starts at ~0).
extern "C" __global__ void mneme_bytes_diff(const uint8_t* a, const uint8_t* b, unsigned long long n,
                                            unsigned long long* out) {
    unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long local_count = 0, local_first = ~0ull;
    bool aligned = ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) & 15u) == 0;
    unsigned long long vec = aligned ? n / 16 : 0;
    const uint4* a4 = reinterpret_cast<const uint4*>(a);
    const uint4* b4 = reinterpret_cast<const uint4*>(b);
    for (unsigned long long i = tid; i < vec; i += stride) {
        uint4 x = a4[i], y = b4[i];
        if (x.x != y.x || x.y != y.y || x.z != y.z || x.w != y.w) {
            for (int k = 0; k < 16; ++k) {
                if (a[i * 16 + k] != b[i * 16 + k]) {
                    ++local_count;
                    if (i * 16 + k < local_first) local_first = i * 16 + k;
                }
            }
        }
    }
    for (unsigned long long i = vec * 16 + tid; i < n; i += stride) {
        if (a[i] != b[i]) {
            ++local_count;
            if (i < local_first) local_first = i;
        }
    }
    if (local_count) {
        atomicAdd(&out[0], local_count);
        atomicMin(&out[1], local_first);
    }
}

// Typed comparison statistics for tolerance policies.
// relative != 0: an element violates when |a-b| > threshold * |b|; else when |a-b| > threshold.
template <typename T>
__device__ void tolerance_stats(const T* a, const T* b, unsigned long long n, double threshold, int relative,
                                double* dstats, unsigned long long* counters) {
    unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    double sum_abs = 0, sum_sq = 0, max_abs = 0, ref_abs = 0, ref_sq = 0, ref_max = 0, max_rel = 0;
    unsigned long long violations = 0, first = ~0ull, nan_mismatch = 0;
    for (unsigned long long i = tid; i < n; i += stride) {
        double x = to_double(a[i]);
        double y = to_double(b[i]);
        bool xn = isnan(x), yn = isnan(y);
        if (xn || yn) {
            if (xn != yn) {
                ++nan_mismatch;
                ++violations;
                if (i < first) first = i;
            }
            continue;
        }
        double d = (x == y) ? 0.0 : fabs(x - y);  // equal infinities differ by 0, not NaN
        double r = fabs(y);
        if (isnan(d)) d = INFINITY;
        sum_abs += d;
        sum_sq += d * d;
        max_abs = fmax(max_abs, d);
        ref_abs += r;
        ref_sq += r * r;
        ref_max = fmax(ref_max, r);
        if (r > 0) max_rel = fmax(max_rel, d / r);
        else if (d > 0) max_rel = INFINITY;
        bool bad = relative ? (d > threshold * r) : (d > threshold);
        if (bad) {
            ++violations;
            if (i < first) first = i;
        }
    }
    if (sum_abs != 0) atomicAdd(&dstats[S_SUM_ABS_DIFF], sum_abs);
    if (sum_sq != 0) atomicAdd(&dstats[S_SUM_SQ_DIFF], sum_sq);
    if (max_abs != 0) atomic_max_nonneg(&dstats[S_MAX_ABS_DIFF], max_abs);
    if (ref_abs != 0) atomicAdd(&dstats[S_SUM_ABS_REF], ref_abs);
    if (ref_sq != 0) atomicAdd(&dstats[S_SUM_SQ_REF], ref_sq);
    if (ref_max != 0) atomic_max_nonneg(&dstats[S_MAX_ABS_REF], ref_max);
    if (max_rel != 0) atomic_max_nonneg(&dstats[S_MAX_REL_DIFF], max_rel);
    if (violations) {
        atomicAdd(&counters[C_VIOLATIONS], violations);
        atomicMin(&counters[C_FIRST_VIOLATION], first);
    }
    if (nan_mismatch) atomicAdd(&counters[C_NAN_MISMATCH], nan_mismatch);
}

#define MNEME_TOLERANCE_KERNEL(NAME, T)                                                                   \
    extern "C" __global__ void mneme_tol_##NAME(const T* a, const T* b, unsigned long long n, double thr, \
                                                int relative, double* dstats, unsigned long long* counters) { \
        tolerance_stats<T>(a, b, n, thr, relative, dstats, counters);                                     \
    }

MNEME_TOLERANCE_KERNEL(u8, uint8_t)
MNEME_TOLERANCE_KERNEL(i8, int8_t)
MNEME_TOLERANCE_KERNEL(u16, uint16_t)
MNEME_TOLERANCE_KERNEL(i16, int16_t)
MNEME_TOLERANCE_KERNEL(u32, uint32_t)
MNEME_TOLERANCE_KERNEL(i32, int32_t)
MNEME_TOLERANCE_KERNEL(u64, unsigned long long)
MNEME_TOLERANCE_KERNEL(i64, long long)
MNEME_TOLERANCE_KERNEL(f16, __half)
MNEME_TOLERANCE_KERNEL(bf16, __nv_bfloat16)
MNEME_TOLERANCE_KERNEL(f32, float)
MNEME_TOLERANCE_KERNEL(f64, double)

// Keeps the GPU busy for `ns` nanoseconds, so that the launches enqueued behind it
// run back to back: their events then time the kernels, not the host's enqueueing.
extern "C" __global__ void mneme_spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

// Reads `n` 16-byte words, so the L2 holds clean lines of a scratch buffer: after a
// large reset copy, the next kernel then does not start with an L2 full of dirty
// lines to write back (which a kernel running inside its application does not meet).
extern "C" __global__ void mneme_l2_scrub(const uint4* p, unsigned long long n, unsigned* sink) {
    unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned acc = 0;
    for (unsigned long long i = tid; i < n; i += stride) {
        uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u) *sink = acc;  // practically never: keeps the loads
}
