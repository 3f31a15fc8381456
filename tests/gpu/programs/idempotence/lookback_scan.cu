// Single-pass inclusive scan with decoupled look-back (Merrill and Garland): each block
// takes a tile from an atomic ticket (so a tile only ever waits on tiles whose blocks are
// already running), publishes its aggregate in the tile-status array, then walks back
// through its predecessors' status words, spinning on those not yet published, until it
// meets an inclusive prefix. The last block out clears the status words it used, so the
// next scan finds them clean; the 4-byte ticket is the host's to clear before each scan.
//
// A second launch without that clearing takes tickets T..2T-1: tile T waits on tile T-1's
// status, which no block of this launch will ever publish (it was cleared), and every
// later tile waits on tile T. The launch never ends.
#include "common.h"

constexpr int kItems = 8;  // elements per thread; a tile is blockDim.x * kItems elements
constexpr unsigned long long kInvalid = 0, kAggregate = 1, kPrefix = 2;

__device__ __forceinline__ unsigned long long status_word(unsigned long long flag, int value) {
    return (flag << 32) | static_cast<unsigned>(value);
}

// counters[0]: the tile ticket; counters[1]: blocks done. status: one word per tile
// (flag << 32 | value), at least as many words as tiles.
__global__ void lookback_scan(const int* in, int* out, int n, unsigned* counters, unsigned long long* status) {
    __shared__ int partial[1024];
    __shared__ unsigned tile_s;
    __shared__ int exclusive_s;
    __shared__ bool last_s;
    const unsigned tid = threadIdx.x, threads = blockDim.x;
    if (tid == 0) tile_s = atomicAdd(&counters[0], 1u);
    __syncthreads();
    const unsigned tile = tile_s;

    // The tile's elements, kItems consecutive ones per thread, and the block's inclusive scan of the thread sums.
    const long long first = (static_cast<long long>(tile) * threads + tid) * kItems;
    int v[kItems], sum = 0;
    for (int k = 0; k < kItems; ++k) {
        v[k] = first + k < n ? in[first + k] : 0;
        sum += v[k];
    }
    partial[tid] = sum;
    __syncthreads();
    for (unsigned offset = 1; offset < threads; offset <<= 1) {
        const int add = tid >= offset ? partial[tid - offset] : 0;
        __syncthreads();
        partial[tid] += add;
        __syncthreads();
    }

    if (tid == 0) {
        const int aggregate = partial[threads - 1];
        int exclusive = 0;
        if (tile == 0) {
            store_release(&status[0], status_word(kPrefix, aggregate));
        } else {
            store_release(&status[tile], status_word(kAggregate, aggregate));
            for (long long p = static_cast<long long>(tile) - 1;; --p) {
                const unsigned long long word = wait_while_equal(&status[p], kInvalid);  // INVALID is the all-zero word
                exclusive += static_cast<int>(static_cast<unsigned>(word));
                if ((word >> 32) == kPrefix) break;
            }
            store_release(&status[tile], status_word(kPrefix, exclusive + aggregate));
        }
        exclusive_s = exclusive;
    }
    __syncthreads();

    int running = exclusive_s + partial[tid] - sum;
    for (int k = 0; k < kItems; ++k) {
        running += v[k];
        if (first + k < n) out[first + k] = running;
    }

    // The last block out leaves the status words of this launch's tiles clean for the next scan.
    __syncthreads();
    if (tid == 0) {
        __threadfence();
        last_s = atomicAdd(&counters[1], 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last_s) {
        __threadfence();
        for (unsigned t = tid; t < gridDim.x; t += threads) status[t] = kInvalid;
        if (tid == 0) counters[1] = 0;
    }
}

int main() {
    const int n = 1 << 20, threads = 128;
    const int tiles = (n + threads * kItems - 1) / (threads * kItems);
    // Room for a tile per thread (the smallest block a tuner may try: one thread) and for a second launch's tickets.
    const size_t capacity = static_cast<size_t>(tiles) * threads + tiles;
    std::vector<int> h(n);
    Lcg rng{11};
    for (int& x : h) x = static_cast<int>(rng.below(16));
    int* in = to_device(h);
    int* out = to_device(std::vector<int>(n, -1));
    unsigned* counters = to_device(std::vector<unsigned>(2, 0u));
    unsigned long long* status = to_device(std::vector<unsigned long long>(capacity, kInvalid));

    lookback_scan<<<tiles, threads>>>(in, out, n, counters, status);
    CHECK(cudaGetLastError());

    std::vector<int> got = to_host(out, n);
    std::vector<unsigned> c = to_host(counters, 2);
    std::vector<unsigned long long> s = to_host(status, capacity);
    long long expect = 0;
    bool ok = c[0] == static_cast<unsigned>(tiles) && c[1] == 0;
    for (int i = 0; i < n; ++i) {
        expect += h[i];
        ok &= got[i] == expect;
    }
    for (unsigned long long w : s) ok &= w == kInvalid;
    return report("lookback_scan", ok, "the scan, the ticket or the cleared status differs");
}
