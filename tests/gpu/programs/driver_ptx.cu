// Driver API only (as NVRTC and CuPy users do): cuModuleLoadData of PTX text,
// cuMemAlloc, cuLaunchKernel. Built with nvcc, linked with -lcuda.
#include <cuda.h>

#include <cstdio>

static const char* kPtx = R"(
.version 8.0
.target sm_90
.address_size 64
.visible .entry saxpy(.param .f32 a, .param .u64 x, .param .u64 y, .param .u32 n)
{
  .reg .pred %p<2>;
  .reg .f32 %f<5>;
  .reg .b32 %r<6>;
  .reg .b64 %rd<8>;
  ld.param.f32 %f1, [a];
  ld.param.u64 %rd1, [x];
  ld.param.u64 %rd2, [y];
  ld.param.u32 %r2, [n];
  mov.u32 %r3, %ctaid.x;
  mov.u32 %r4, %ntid.x;
  mov.u32 %r5, %tid.x;
  mad.lo.s32 %r1, %r3, %r4, %r5;
  setp.ge.u32 %p1, %r1, %r2;
  @%p1 bra DONE;
  cvta.to.global.u64 %rd3, %rd1;
  cvta.to.global.u64 %rd4, %rd2;
  mul.wide.u32 %rd5, %r1, 4;
  add.s64 %rd6, %rd3, %rd5;
  add.s64 %rd7, %rd4, %rd5;
  ld.global.f32 %f2, [%rd6];
  ld.global.f32 %f3, [%rd7];
  fma.rn.f32 %f4, %f1, %f2, %f3;
  st.global.f32 [%rd7], %f4;
DONE:
  ret;
}
)";

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { std::printf("%s failed: %d\n", #x, r_); return 1; } } while (0)

int main() {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CUmodule mod;
  CK(cuModuleLoadData(&mod, kPtx));
  CUfunction f;
  CK(cuModuleGetFunction(&f, mod, "saxpy"));
  const unsigned n = 2048;
  CUdeviceptr x, y;
  CK(cuMemAlloc(&x, n * 4));
  CK(cuMemAlloc(&y, n * 4));
  float hx[n], hy[n];
  for (unsigned i = 0; i < n; ++i) hx[i] = float(i), hy[i] = 1.0f;
  CK(cuMemcpyHtoD(x, hx, sizeof hx));
  CK(cuMemcpyHtoD(y, hy, sizeof hy));
  float a = 3.0f;
  void* params[] = {&a, &x, &y, (void*)&n};
  CK(cuLaunchKernel(f, n / 256, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr));
  CK(cuMemcpyDtoH(hy, y, sizeof hy));
  std::printf("driver_ptx: y[10]=%g x=%p\n", hy[10], (void*)x);
  return hy[10] == 31.0f ? 0 : 1;
}
