// Jones-Plassmann graph colouring driven by a worklist: a vertex is coloured (the smallest
// colour none of its higher-priority neighbours has) once all those neighbours are; each
// vertex counts its uncoloured higher-priority neighbours, and the thread whose decrement
// brings a count to zero appends that vertex to the worklist (an atomic tail). Persistent
// threads take worklist slots from an atomic head, wait until their slot is filled, and
// clear it once taken (the worklist is a queue of slots, consumed as it is read). The host
// seeds the worklist with the vertices no neighbour outranks. The colours do not depend on
// the order of anything: the result is the same bytes every run. The last thread out
// resets the head for the next colouring; the host refills the worklist and the counts.
//
// A second launch without that refill finds the worklist empty (every slot consumed) and
// every count at zero: each thread takes a slot from the head and waits for it to be
// filled, which nothing will ever do. The launch never ends.
#include "common.h"

constexpr unsigned kEmpty = 0xffffffffu;

__host__ __device__ inline bool outranks(const unsigned* prio, int u, int v) {
    return prio[u] > prio[v] || (prio[u] == prio[v] && u > v);
}

// queue[0]: the head (next slot to take), queue[1]: the tail (next slot to fill), queue[2]: threads done.
__global__ void jp_color(const int* adj_ptr, const int* adj, const unsigned* prio, int vertices, unsigned* items,
                         unsigned* queue, unsigned* pending, int* color) {
    for (;;) {
        const unsigned t = atomicAdd(&queue[0], 1u);
        if (t >= static_cast<unsigned>(vertices)) break;
        const int v = static_cast<int>(wait_while_equal(&items[t], kEmpty));
        items[t] = kEmpty;  // consumed
        unsigned long long used = 0;
        for (int k = adj_ptr[v]; k < adj_ptr[v + 1]; ++k)
            if (outranks(prio, adj[k], v)) used |= 1ull << color[adj[k]];
        color[v] = __ffsll(static_cast<long long>(~used)) - 1;
        for (int k = adj_ptr[v]; k < adj_ptr[v + 1]; ++k) {
            const int u = adj[k];
            if (outranks(prio, v, u) && device_ref(pending[u]).fetch_sub(1u, cuda::memory_order_acq_rel) == 1u)
                store_release(&items[atomicAdd(&queue[1], 1u)], static_cast<unsigned>(u));
        }
    }
    if (last_thread_out(&queue[2])) {  // every slot is taken: the next colouring starts from slot 0
        queue[0] = 0;
        queue[2] = 0;
    }
}

int main() {
    const int vertices = 1 << 15;
    const size_t max_degree = 48;  // colours stay below 64: one 64-bit mask of used colours
    std::vector<std::vector<int>> nbr(vertices);
    Lcg rng{31};
    for (int v = 0; v < vertices; ++v)
        for (int e = 0; e < 5; ++e) {
            const int u = static_cast<int>(rng.below(vertices));
            if (u == v || nbr[v].size() >= max_degree || nbr[u].size() >= max_degree) continue;
            if (std::find(nbr[v].begin(), nbr[v].end(), u) != nbr[v].end()) continue;
            nbr[v].push_back(u);
            nbr[u].push_back(v);
        }
    std::vector<int> adj_ptr{0}, adj;
    for (auto& list : nbr) {
        std::sort(list.begin(), list.end());
        adj.insert(adj.end(), list.begin(), list.end());
        adj_ptr.push_back(static_cast<int>(adj.size()));
    }
    std::vector<unsigned> prio(vertices), pending(vertices, 0), items(vertices, kEmpty);
    for (int v = 0; v < vertices; ++v) prio[v] = mix32(static_cast<unsigned>(v) * 2654435761u);
    unsigned roots = 0;
    for (int v = 0; v < vertices; ++v) {
        for (int u : nbr[v]) pending[v] += outranks(prio.data(), u, v);
        if (pending[v] == 0) items[roots++] = static_cast<unsigned>(v);
    }

    int* d_adj_ptr = to_device(adj_ptr);
    int* d_adj = to_device(adj);
    unsigned* d_prio = to_device(prio);
    unsigned* d_items = to_device(items);
    unsigned* d_queue = to_device(std::vector<unsigned>{0u, roots, 0u});
    unsigned* d_pending = to_device(pending);
    int* d_color = to_device(std::vector<int>(vertices, -1));

    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    jp_color<<<2 * sms, 128>>>(d_adj_ptr, d_adj, d_prio, vertices, d_items, d_queue, d_pending, d_color);
    CHECK(cudaGetLastError());

    // The same colouring on the host: vertices in priority order, each taking the smallest colour its
    // higher-priority neighbours leave.
    std::vector<int> by_rank(vertices), want(vertices, -1);
    for (int v = 0; v < vertices; ++v) by_rank[v] = v;
    std::sort(by_rank.begin(), by_rank.end(), [&](int a, int b) { return outranks(prio.data(), a, b); });
    for (int v : by_rank) {
        unsigned long long used = 0;
        for (int u : nbr[v])
            if (outranks(prio.data(), u, v)) used |= 1ull << want[u];
        int c = 0;
        while (used >> c & 1ull) ++c;
        want[v] = c;
    }
    std::vector<int> got = to_host(d_color, vertices);
    std::vector<unsigned> q = to_host(d_queue, 3), left = to_host(d_pending, vertices);
    std::vector<unsigned> slots = to_host(d_items, vertices);
    bool ok = got == want && q[0] == 0 && q[1] == static_cast<unsigned>(vertices) && q[2] == 0;
    for (int v = 0; v < vertices; ++v) {
        ok &= left[v] == 0 && slots[v] == kEmpty;
        for (int u : nbr[v]) ok &= got[u] != got[v];
    }
    return report("jp_coloring", ok, "the colouring, the worklist or the counts differ");
}
