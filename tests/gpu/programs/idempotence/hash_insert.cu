// A lock-based bulk insert into a chained hash table: each bucket is a sorted linked list
// behind a sentinel node, every node has its own spin lock, and nodes come from a pool
// through an atomic counter. Each thread takes one ticket from the pool counter: the node
// it gets and the key it inserts (keys[ticket]). It walks its bucket's list without locks
// to the last node with a smaller key, locks that node, checks that nothing smaller was
// linked after it meanwhile (else walks on), links its node and unlocks. The lists end up
// sorted whatever the order of the inserts, and node k holds key k: the table is the same
// bytes every run. The pool holds exactly one node per key, which the kernel asserts.
//
// A second launch without resetting the pool counter gets tickets n..2n-1, past the pool:
// the device-side assert fails and the launch ends with cudaErrorAssert, which destroys
// the CUDA context (unchecked, those tickets would read keys and write nodes past their
// arrays).
#include <cassert>

#include "common.h"

constexpr unsigned kNil = 0xffffffffu;

struct Node {
    unsigned key;
    unsigned next;  // a pool index, or kNil
    int lock;
    int pad;
};

__host__ __device__ inline unsigned bucket_of(unsigned key, unsigned buckets) {
    return mix32(key ^ 0x5bd1e995u) % buckets;
}

__global__ void hash_insert(const unsigned* keys, int n, Node* pool, unsigned capacity, unsigned* pool_next,
                            Node* heads, unsigned buckets) {
    if (blockIdx.x * blockDim.x + threadIdx.x >= static_cast<unsigned>(n)) return;
    const unsigned s = atomicAdd(pool_next, 1u);
    assert(s < capacity && "the node pool is exhausted");
    const unsigned key = keys[s];
    Node* me = &pool[s];
    me->key = key;
    me->next = kNil;
    Node* pred = &heads[bucket_of(key, buckets)];
    for (;;) {
        unsigned next = load_acquire(&pred->next);
        while (next != kNil && pool[next].key < key) {
            pred = &pool[next];
            next = load_acquire(&pred->next);
        }
        spin_lock(&pred->lock);
        next = load_acquire(&pred->next);
        if (next != kNil && pool[next].key < key) {  // a smaller key was linked after pred meanwhile
            spin_unlock(&pred->lock);
            continue;
        }
        me->next = next;
        store_release(&pred->next, s);
        spin_unlock(&pred->lock);
        return;
    }
}

int main() {
    const int n = 1 << 16;
    const unsigned buckets = 4096;
    std::vector<unsigned> keys(n);
    for (int i = 0; i < n; ++i) keys[i] = mix32(static_cast<unsigned>(i) + 1u);  // distinct
    unsigned* d_keys = to_device(keys);
    Node* pool = to_device(std::vector<Node>(n, Node{0, kNil, 0, 0}));
    Node* heads = to_device(std::vector<Node>(buckets, Node{0, kNil, 0, 0}));
    unsigned* pool_next = to_device(std::vector<unsigned>(1, 0u));

    const int threads = 128;
    hash_insert<<<(n + threads - 1) / threads, threads>>>(d_keys, n, pool, n, pool_next, heads, buckets);
    CHECK(cudaGetLastError());

    std::vector<Node> p = to_host(pool, n), h = to_host(heads, buckets);
    bool ok = to_host(pool_next, 1)[0] == static_cast<unsigned>(n);
    std::vector<char> seen(n, 0);
    int found = 0;
    for (unsigned b = 0; b < buckets && ok; ++b) {
        ok &= h[b].lock == 0;
        unsigned prev_key = 0;
        bool first = true;
        for (unsigned k = h[b].next; k != kNil && ok; k = p[k].next) {
            ok &= k < static_cast<unsigned>(n) && !seen[k] && p[k].key == keys[k] && p[k].lock == 0;
            ok &= bucket_of(p[k].key, buckets) == b && (first || prev_key < p[k].key);
            if (!ok) break;
            seen[k] = 1;
            prev_key = p[k].key;
            first = false;
            ++found;
        }
    }
    ok &= found == n;
    return report("hash_insert", ok, "a bucket list is not the sorted set of its keys");
}
