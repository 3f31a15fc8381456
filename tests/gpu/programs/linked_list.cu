// A kernel taking a struct of pointers by value and walking a linked list
// whose nodes live in device memory: pointers stored in memory must stay valid
// at replay (fixed-address window) and `reachable` scope must follow them.
#include <cstdio>
#include <vector>

struct Node {
  int value;
  Node* next;
};

struct Work {
  const Node* head;
  int* sum;
  float* unused;  // allocated, not reachable from the list
  long long tag;
};

__global__ void walk(Work w) {
  int s = 0;
  for (const Node* n = w.head; n; n = n->next) s += n->value;
  *w.sum = s;
}

int main() {
  const int count = 10;
  Node* nodes;
  int* sum;
  float* unused;
  char* unreachable;  // referenced by nothing the kernel sees: `reachable` scope leaves it out
  cudaMalloc(&nodes, count * sizeof(Node));
  cudaMalloc(&unreachable, 3 << 20);
  cudaMalloc(&sum, sizeof(int));
  cudaMalloc(&unused, 1 << 20);
  std::vector<Node> host(count);
  // Link them in reverse order so the walk jumps around memory.
  for (int i = 0; i < count; ++i) host[i] = Node{i + 1, i > 0 ? nodes + (i - 1) : nullptr};
  cudaMemcpy(nodes, host.data(), count * sizeof(Node), cudaMemcpyHostToDevice);
  cudaMemset(sum, 0, sizeof(int));
  Work w{nodes + count - 1, sum, unused, 42};
  walk<<<1, 1>>>(w);
  int s = 0;
  cudaMemcpy(&s, sum, sizeof s, cudaMemcpyDeviceToHost);
  std::printf("linked_list: sum=%d\n", s);
  return s == count * (count + 1) / 2 ? 0 : 1;
}
