// A persistent kernel draining a work queue: a grid sized to fill the GPU once, each thread
// taking the next item from an atomic ticket counter until the queue is exhausted. Items
// are segments of very different lengths (the reason for a queue rather than a fixed
// assignment); each item's result depends on its segment only.
//
// A second launch without resetting the counter finds it exhausted: every thread's first
// ticket is past the queue, so the launch does nothing but advance the counter by one
// ticket per thread. The outputs keep the first launch's values: only the counter shows
// that the second launch did not do the work (and it takes almost no time).
#include "common.h"

struct Item {
    int begin;
    int length;
};

__global__ void drain_queue(const Item* queue, int items, const float* values, float* out, unsigned* next) {
    for (;;) {
        const unsigned t = atomicAdd(next, 1u);
        if (t >= static_cast<unsigned>(items)) break;
        const Item it = queue[t];
        float acc = 0.0f;
        for (int k = 0; k < it.length; ++k) acc = fmaf(acc, 0.75f, values[it.begin + k]);
        out[t] = acc;
    }
}

int main() {
    const int items = 20000;
    std::vector<Item> queue(items);
    Lcg rng{23};
    int total = 0;
    for (Item& it : queue) {
        // Mostly short segments, a few long ones.
        const bool long_one = rng.below(8) == 0;
        it.length = long_one ? 256 + static_cast<int>(rng.below(1792)) : 1 + static_cast<int>(rng.below(64));
        it.begin = total;
        total += it.length;
    }
    std::vector<float> h = fill(total, -1.0f, 1.0f, 5);
    Item* d_queue = to_device(queue);
    float* values = to_device(h);
    float* out = to_device(std::vector<float>(items, 0.0f));
    unsigned* next = to_device(std::vector<unsigned>(1, 0u));

    int sms = 0, per_sm = 0;
    const int threads = 128;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, drain_queue, threads, 0));
    const int blocks = sms * (per_sm < 2 ? 1 : 2);
    drain_queue<<<blocks, threads>>>(d_queue, items, values, out, next);
    CHECK(cudaGetLastError());

    std::vector<float> got = to_host(out, items);
    const unsigned after = to_host(next, 1)[0];
    bool ok = after == static_cast<unsigned>(items + blocks * threads);  // each thread's last ticket: past the queue
    for (int t = 0; t < items; ++t) {
        float acc = 0.0f;
        for (int k = 0; k < queue[t].length; ++k) acc = std::fmaf(acc, 0.75f, h[queue[t].begin + k]);
        ok &= got[t] == acc;
    }
    return report("ticket_queue", ok, "an item's result or the final ticket differs");
}
