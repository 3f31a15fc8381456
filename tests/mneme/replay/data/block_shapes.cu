// Kernels whose code fixes or caps their block shape, for the block-limit readers
// (tests/replay/test_block_limits.py) and the tuner's knob applicability (tests/tuner/test_knobs.py).
// Regenerate the checked-in PTX and cubin with:  make -C tests/replay/data
//
// __block_size__ puts .reqntid on the PTX entry (EIATTR_REQNTID in the cubin): any other block fails
// to launch, as with Triton's kernels. __launch_bounds__ puts .maxntid (EIATTR_MAX_THREADS): larger
// blocks fail to launch.

extern "C" __global__ void __block_size__((128, 1, 1)) vecadd_fixed(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void __block_size__((16, 8, 1)) tile_fixed(float* out, int width) {
  int x = blockIdx.x * 16 + threadIdx.x, y = blockIdx.y * 8 + threadIdx.y;
  out[y * width + x] = static_cast<float>(x + y);
}

extern "C" __global__ void __launch_bounds__(256) vecadd_capped(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void vecadd_free(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
