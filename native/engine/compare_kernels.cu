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

// Statistics slots written by the tolerance kernels (doubles, then counters, then hashes).
// Keep in sync with mneme/replay/tolerance.py (the slot indices) and engine.cpp (kSlotWords).
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
    C_DIFFERING = 3,      // elements whose bits differ (NaN against NaN does not count)
    C_MAX_ULP = 4,        // max distance in units in the last place (integers: |a-b|); atomicMax
    N_COUNTERS = 5,
};
// After the counters, when a check asks for them (engine.cpp): the three hashes of
// mneme_hash_elems for the actual side, then for the expected side.

// How an element violates a tolerance: |a-b| > thr, |a-b| > thr*|b|, or ULP distance > thr.
enum { MODE_ABSOLUTE = 0, MODE_RELATIVE = 1, MODE_ULP = 2 };

__device__ __forceinline__ void atomic_max_nonneg(double* slot, double v) {
    // Non-negative doubles order like their bit patterns.
    atomicMax(reinterpret_cast<unsigned long long*>(slot), __double_as_longlong(v));
}

template <typename T> __device__ __forceinline__ double to_double(T v) { return static_cast<double>(v); }

// The element's bits, and its position on the number line as a signed integer: floats
// (sign-magnitude) map so that adjacent representable values differ by one, so the
// distance of two values is their ULP distance; integers map to themselves (u64 shifted).
template <typename T> __device__ __forceinline__ unsigned long long raw_bits(T v) {
    unsigned long long r = 0;
    memcpy(&r, &v, sizeof(T));
    return r;
}
template <typename T> struct IsFloat { static constexpr bool value = false; };
template <> struct IsFloat<__half> { static constexpr bool value = true; };
template <> struct IsFloat<__nv_bfloat16> { static constexpr bool value = true; };
template <> struct IsFloat<float> { static constexpr bool value = true; };
template <> struct IsFloat<double> { static constexpr bool value = true; };

template <typename T> __device__ __forceinline__ long long ordered(T v) {
    unsigned long long bits = raw_bits(v);
    if constexpr (IsFloat<T>::value) {
        unsigned long long sign = 1ull << (8 * sizeof(T) - 1);
        long long magnitude = static_cast<long long>(bits & (sign - 1));
        return (bits & sign) ? -magnitude : magnitude;
    } else if constexpr (sizeof(T) == 8 && static_cast<T>(-1) > static_cast<T>(0)) {
        return static_cast<long long>(bits ^ (1ull << 63));  // u64: keep the order in a signed type
    } else {
        return static_cast<long long>(v);
    }
}

__device__ __forceinline__ unsigned long long distance(long long x, long long y) {
    return x >= y ? static_cast<unsigned long long>(x) - static_cast<unsigned long long>(y)
                  : static_cast<unsigned long long>(y) - static_cast<unsigned long long>(x);
}
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
// mode (MODE_*): an element violates when |a-b| > threshold, |a-b| > threshold * |b|, or its
// ULP distance > threshold. Every mode gathers every statistic.
template <typename T>
__device__ void tolerance_stats(const T* a, const T* b, unsigned long long n, double threshold, int mode,
                                double* dstats, unsigned long long* counters) {
    unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    double sum_abs = 0, sum_sq = 0, max_abs = 0, ref_abs = 0, ref_sq = 0, ref_max = 0, max_rel = 0;
    unsigned long long violations = 0, first = ~0ull, nan_mismatch = 0, differing = 0, max_ulp = 0;
    for (unsigned long long i = tid; i < n; i += stride) {
        T av = a[i], bv = b[i];
        double x = to_double(av);
        double y = to_double(bv);
        bool xn = isnan(x), yn = isnan(y);
        if (xn || yn) {
            if (xn != yn) {
                ++differing;
                ++nan_mismatch;
                ++violations;
                if (i < first) first = i;
            }
            continue;
        }
        bool same_bits = raw_bits(av) == raw_bits(bv);
        unsigned long long ulp = same_bits ? 0 : distance(ordered(av), ordered(bv));
        if (!same_bits) ++differing;
        if (ulp > max_ulp) max_ulp = ulp;
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
        bool bad = mode == MODE_ULP ? (static_cast<double>(ulp) > threshold)
                 : mode == MODE_RELATIVE ? (d > threshold * r) : (d > threshold);
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
    if (differing) atomicAdd(&counters[C_DIFFERING], differing);
    if (max_ulp) atomicMax(&counters[C_MAX_ULP], max_ulp);
}

#define MNEME_TOLERANCE_KERNEL(NAME, T)                                                                   \
    extern "C" __global__ void mneme_tol_##NAME(const T* a, const T* b, unsigned long long n, double thr, \
                                                int mode, double* dstats, unsigned long long* counters) {     \
        tolerance_stats<T>(a, b, n, thr, mode, dstats, counters);                                         \
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

// Order-independent and positional hashes of `n` elements of `elem` bytes (1, 2, 4 or 8;
// p aligned to it): out[0] and out[1] are sums of two different mixes of each element
// (equal multisets give equal sums, whatever the order: a permuted output keeps them),
// out[2] sums a mix of each element with its index (any change of content or order
// changes it). Sums modulo 2^64 of well-mixed 64-bit values: a collision of two
// different contents is as likely as guessing a 64-bit value, twice for the multiset.
__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

extern "C" __global__ void mneme_hash_elems(const uint8_t* p, unsigned long long n, unsigned elem,
                                            unsigned long long* out) {
    unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long h1 = 0, h2 = 0, hp = 0;
    for (unsigned long long i = tid; i < n; i += stride) {
        unsigned long long x;
        switch (elem) {
            case 1: x = p[i]; break;
            case 2: x = reinterpret_cast<const uint16_t*>(p)[i]; break;
            case 4: x = reinterpret_cast<const uint32_t*>(p)[i]; break;
            default: x = reinterpret_cast<const unsigned long long*>(p)[i]; break;
        }
        h1 += mix64(x);
        h2 += mix64(x ^ 0xD6E8FEB86659FD93ull) * 0x2545F4914F6CDD1Dull;
        hp += mix64(x ^ mix64(i + 0x632BE59BD9B4E019ull));
    }
    if (h1) atomicAdd(&out[0], h1);
    if (h2) atomicAdd(&out[1], h2);
    if (hp) atomicAdd(&out[2], hp);
}

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

// Holds the stream until the host has enqueued far enough ahead (run_batch's gate):
// spins until *flag (host memory mapped into the device) reaches `value`, or for
// `max_ns` at most, so that a host that never opens the gate cannot hang the GPU.
extern "C" __global__ void mneme_wait_flag(const volatile unsigned* flag, unsigned value, unsigned long long max_ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        if (*flag >= value) return;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < max_ns);
}
