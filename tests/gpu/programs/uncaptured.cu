// A kernel that reaches memory the recorder does not capture (mapped pinned host
// memory), marked unsupported with the reason, beside kernels on what it
// captures: device memory, managed memory, a pointer to managed memory kept in
// device memory, and a texture object (recreated at replay), which replay.
#include <cstdio>

struct Holder {
  float* data;
};

__global__ void scale_plain(float* v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = 2.0f * v[i] + 1.0f;
}
__global__ void scale_managed(float* v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = 3.0f * v[i];
}
__global__ void scale_host(float* v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = v[i] + 5.0f;
}
__global__ void read_texture(cudaTextureObject_t tex, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex1Dfetch<float>(tex, i) * 0.5f;
}
__global__ void follow_pointer(const Holder* h, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = h->data[i] + 1.0f;
}

#define CHECK(x)                                                                  \
  do {                                                                            \
    cudaError_t e = (x);                                                          \
    if (e != cudaSuccess) {                                                       \
      std::printf("uncaptured: %s failed: %s\n", #x, cudaGetErrorString(e));      \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

int main() {
  const int n = 1024;
  const size_t bytes = n * sizeof(float);
  float host[n];
  for (int i = 0; i < n; ++i) host[i] = 0.25f * i;

  float *plain, *out;
  CHECK(cudaMalloc(&plain, bytes));
  CHECK(cudaMalloc(&out, bytes));
  CHECK(cudaMemcpy(plain, host, bytes, cudaMemcpyHostToDevice));
  scale_plain<<<n / 256, 256>>>(plain, n);

  float* managed;
  CHECK(cudaMallocManaged(&managed, bytes));
  for (int i = 0; i < n; ++i) managed[i] = host[i];
  scale_managed<<<n / 256, 256>>>(managed, n);
  CHECK(cudaDeviceSynchronize());

  float* mapped;
  CHECK(cudaHostAlloc(&mapped, bytes, cudaHostAllocMapped));
  for (int i = 0; i < n; ++i) mapped[i] = host[i];
  float* mapped_dev;
  CHECK(cudaHostGetDevicePointer(&mapped_dev, mapped, 0));
  scale_host<<<n / 256, 256>>>(mapped_dev, n);
  CHECK(cudaDeviceSynchronize());

  cudaResourceDesc res = {};
  res.resType = cudaResourceTypeLinear;
  res.res.linear.devPtr = plain;
  res.res.linear.desc = cudaCreateChannelDesc<float>();
  res.res.linear.sizeInBytes = bytes;
  cudaTextureDesc td = {};
  td.readMode = cudaReadModeElementType;
  cudaTextureObject_t tex;
  CHECK(cudaCreateTextureObject(&tex, &res, &td, nullptr));
  read_texture<<<n / 256, 256>>>(tex, out, n);

  Holder h{managed};
  Holder* dh;
  CHECK(cudaMalloc(&dh, sizeof(Holder)));
  CHECK(cudaMemcpy(dh, &h, sizeof h, cudaMemcpyHostToDevice));
  follow_pointer<<<n / 256, 256>>>(dh, out, n);
  CHECK(cudaDeviceSynchronize());

  float check[n];
  CHECK(cudaMemcpy(check, out, bytes, cudaMemcpyDeviceToHost));
  bool ok = managed[7] == 3.0f * host[7] && mapped[7] == host[7] + 5.0f && check[7] == 3.0f * host[7] + 1.0f;
  CHECK(cudaDestroyTextureObject(tex));
  std::printf("uncaptured: %s\n", ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
