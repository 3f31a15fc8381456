// Shared by the non-idempotent programs (tests/gpu/test_non_idempotent.py): the corpus's
// error check, fill, upload, download and one-line report, plus the device-side
// synchronization the kernels build on (acquire/release loads and stores, a polite spin,
// a spin lock) and the "last thread out" test two of them use to reset their ticket.
//
// Every kernel here is correct for one launch on the memory the program prepared, and
// its result does not depend on thread scheduling (the replay compares it bit for bit),
// for any block size with the same number of threads in all (what `mneme tune
// --space-preset launch` varies). None is correct when launched a second time on what its
// first launch left: README.md says what each one does then.
#pragma once
#include <algorithm>

#include <cuda/atomic>

#include "../corpus/corpus.h"

template <typename T> __device__ __forceinline__ cuda::atomic_ref<T, cuda::thread_scope_device> device_ref(T& x) {
    return cuda::atomic_ref<T, cuda::thread_scope_device>(x);
}
template <typename T> __device__ __forceinline__ T load_acquire(T* p) {
    return device_ref(*p).load(cuda::memory_order_acquire);
}
template <typename T> __device__ __forceinline__ void store_release(T* p, T v) {
    device_ref(*p).store(v, cuda::memory_order_release);
}

// Wait until *p differs from `value`; returns what it then holds.
template <typename T> __device__ __forceinline__ T wait_while_equal(T* p, T value) {
    T now;
    while ((now = load_acquire(p)) == value) __nanosleep(64);
    return now;
}

__device__ __forceinline__ void spin_lock(int* lock) {
    int expected = 0;
    while (!device_ref(*lock).compare_exchange_weak(expected, 1, cuda::memory_order_acquire,
                                                    cuda::memory_order_relaxed)) {
        expected = 0;
        __nanosleep(32);
    }
}
__device__ __forceinline__ void spin_unlock(int* lock) { store_release(lock, 0); }

// True for exactly one thread of the launch: the last of all its threads (every block,
// every thread) to get here. Everything the others did before arriving is visible to it.
__device__ __forceinline__ bool last_thread_out(unsigned* arrived) {
    const unsigned threads = gridDim.x * gridDim.y * gridDim.z * blockDim.x * blockDim.y * blockDim.z;
    return device_ref(*arrived).fetch_add(1u, cuda::memory_order_acq_rel) == threads - 1;
}

// A bijection of 32-bit words (distinct inputs give distinct outputs): keys and priorities.
__host__ __device__ inline unsigned mix32(unsigned x) {
    x ^= x >> 16; x *= 0x7feb352du;
    x ^= x >> 15; x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

// A fixed LCG for the programs' pseudo-random structure (graphs, matrices, work sizes).
struct Lcg {
    unsigned s;
    unsigned next() { s = s * 1664525u + 1013904223u; return s >> 8; }
    unsigned below(unsigned n) { return next() % n; }
};
