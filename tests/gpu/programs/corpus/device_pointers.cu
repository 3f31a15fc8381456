// Pointer-chasing structures built on the device: one kernel links a list and a
// binary tree whose node pointers it computes itself (stored in device memory,
// the list's head in a __device__ pointer), later kernels follow those pointers.
// Replay must restore them at the recorded addresses (or relocate every one).
#include "corpus.h"

struct ListNode {
    int value;
    ListNode* next;
};
struct TreeNode {
    float weight;
    TreeNode* left;
    TreeNode* right;
};

__device__ ListNode* d_head;

// Node i links to node (i + stride) % n: from node 0 one chain through every node (stride coprime with n),
// ending at the node whose successor would be node 0 again.
__global__ void link_list(ListNode* nodes, int n, int stride) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int next = (i + stride) % n;
    nodes[i].value = i + 1;
    nodes[i].next = next == 0 ? nullptr : nodes + next;
    if (i == 0) d_head = nodes;
}
__global__ void link_tree(TreeNode* nodes, int n) {  // heap-shaped: node i's children are 2i+1 and 2i+2
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    nodes[i].weight = 0.5f + (i % 7);
    nodes[i].left = 2 * i + 1 < n ? nodes + 2 * i + 1 : nullptr;
    nodes[i].right = 2 * i + 2 < n ? nodes + 2 * i + 2 : nullptr;
}
// One thread per start offset walks the list from the head (through the __device__ pointer).
__global__ void walk_list(long long* sums, int walkers) {
    int w = blockIdx.x * blockDim.x + threadIdx.x;
    if (w >= walkers) return;
    long long s = 0;
    int k = 0;
    for (const ListNode* p = d_head; p; p = p->next, ++k)
        if (k % walkers == w) s += p->value;
    sums[w] = s;
}
// Each thread sums the weights on the path from the root to its leaf, then the whole subtree of its node.
__global__ void walk_tree(const TreeNode* root, float* path_sums, float* subtree_sums, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = 0.0f;
    const TreeNode* p = root;
    int depth = 0;
    for (int k = i + 1; k >> depth > 1; ++depth) {}
    for (int level = depth - 1; level >= -1 && p; --level) {  // the bits of i + 1 below the top one: the path
        s += p->weight;
        if (level >= 0) p = ((i + 1) >> level) & 1 ? p->right : p->left;
    }
    path_sums[i] = s;
    const TreeNode* stack[64];
    int top = 0;
    float t = 0.0f;
    stack[top++] = root + i;
    while (top > 0) {
        const TreeNode* q = stack[--top];
        t += q->weight;
        if (q->right && top < 64) stack[top++] = q->right;
        if (q->left && top < 64) stack[top++] = q->left;
    }
    subtree_sums[i] = t;
}

int main() {
    const int n = 1000, stride = 7, walkers = 8, tn = 1023;
    ListNode* list;
    TreeNode* tree;
    long long* sums;
    float *path, *subtree;
    CHECK(cudaMalloc(&list, n * sizeof(ListNode)));
    CHECK(cudaMalloc(&tree, tn * sizeof(TreeNode)));
    CHECK(cudaMalloc(&sums, walkers * sizeof(long long)));
    CHECK(cudaMalloc(&path, tn * sizeof(float)));
    CHECK(cudaMalloc(&subtree, tn * sizeof(float)));
    link_list<<<(n + 255) / 256, 256>>>(list, n, stride);
    link_tree<<<(tn + 255) / 256, 256>>>(tree, tn);
    walk_list<<<1, walkers>>>(sums, walkers);
    walk_tree<<<(tn + 127) / 128, 128>>>(tree, path, subtree, tn);

    std::vector<long long> hs = to_host(sums, walkers);
    long long total = 0;
    for (long long s : hs) total += s;
    bool ok = total == (long long)n * (n + 1) / 2;  // every node once
    std::vector<float> hp = to_host(path, tn), ht = to_host(subtree, tn);
    std::vector<float> w(tn), expect_sub(tn, 0.0f);
    for (int i = 0; i < tn; ++i) w[i] = 0.5f + (i % 7);
    for (int i = tn - 1; i >= 0; --i) {  // children before parents (weights are halves: every sum is exact)
        expect_sub[i] += w[i];
        if (i > 0) expect_sub[(i - 1) / 2] += expect_sub[i];
    }
    ok &= ht[0] == expect_sub[0] && ht[tn - 1] == w[tn - 1];
    float root_to_last = 0.0f;
    for (int i = tn - 1;; i = (i - 1) / 2) { root_to_last += w[i]; if (i == 0) break; }
    ok &= hp[0] == w[0] && hp[tn - 1] == root_to_last;
    return report("device_pointers", ok, "a walk over the device-built structures gave another sum");
}
