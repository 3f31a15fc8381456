// An application for the fake driver (fake_cuda.cpp) with texture and surface objects: it loads the
// PTX of texture_kernels.cu (argv[1]), makes a texture over linear memory, a texture over a 16 x 8
// CUDA array and a surface over another, runs `sample` (all three handles as arguments: the texture
// over linear memory and the surface both have handle 1) and `table` (the linear texture's handle
// in device memory), checks the results and prints one line.
//   textures_app KERNELS.ptx
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#define CHECK(x)                                                              \
  do {                                                                        \
    CUresult r_ = (x);                                                        \
    if (r_ != CUDA_SUCCESS) {                                                 \
      std::fprintf(stderr, "%s:%d: CUDA error %d\n", __FILE__, __LINE__, r_); \
      std::exit(3);                                                           \
    }                                                                         \
  } while (0)

constexpr int kWidth = 16, kHeight = 8, kN = 128;

CUarray make_array(unsigned flags) {
  CUDA_ARRAY3D_DESCRIPTOR d{};
  d.Width = kWidth;
  d.Height = kHeight;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  d.Flags = flags;
  CUarray a = nullptr;
  CHECK(cuArray3DCreate(&a, &d));
  return a;
}

void array_copy(CUarray array, std::vector<float>& host, bool to_array) {
  CUDA_MEMCPY3D p{};
  if (to_array) {
    p.srcMemoryType = CU_MEMORYTYPE_HOST, p.srcHost = host.data(), p.srcPitch = kWidth * 4, p.srcHeight = kHeight;
    p.dstMemoryType = CU_MEMORYTYPE_ARRAY, p.dstArray = array;
  } else {
    p.srcMemoryType = CU_MEMORYTYPE_ARRAY, p.srcArray = array;
    p.dstMemoryType = CU_MEMORYTYPE_HOST, p.dstHost = host.data(), p.dstPitch = kWidth * 4, p.dstHeight = kHeight;
  }
  p.WidthInBytes = kWidth * 4, p.Height = kHeight, p.Depth = 1;
  CHECK(cuMemcpy3D(&p));
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: textures_app KERNELS.ptx\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  std::string ptx((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(cuInit(0));
  CUmodule module;
  CUfunction sample, table;
  CHECK(cuModuleLoadData(&module, ptx.c_str()));
  CHECK(cuModuleGetFunction(&sample, module, "_Z6sampleyyyPfi"));
  CHECK(cuModuleGetFunction(&table, module, "_Z5tablePKyPfi"));

  std::vector<float> lin(kN), img(kWidth * kHeight), zeros(kWidth * kHeight, 0.0f);
  for (int i = 0; i < kN; ++i) lin[i] = 0.5f * i;
  for (int i = 0; i < kWidth * kHeight; ++i) img[i] = 100.0f + i;
  CUdeviceptr d_lin, out, out2, handles;
  CHECK(cuMemAlloc(&d_lin, kN * 4));
  CHECK(cuMemAlloc(&out, kN * 4));
  CHECK(cuMemAlloc(&out2, kN * 4));
  CHECK(cuMemAlloc(&handles, 64));
  CHECK(cuMemcpyHtoD(d_lin, lin.data(), kN * 4));
  CHECK(cuMemcpyHtoD(out, zeros.data(), kN * 4));
  CHECK(cuMemcpyHtoD(out2, zeros.data(), kN * 4));
  CUarray image = make_array(0), canvas = make_array(CUDA_ARRAY3D_SURFACE_LDST);
  array_copy(image, img, true);
  array_copy(canvas, zeros, true);

  CUDA_RESOURCE_DESC res{};
  res.resType = CU_RESOURCE_TYPE_LINEAR;
  res.res.linear.devPtr = d_lin;
  res.res.linear.format = CU_AD_FORMAT_FLOAT;
  res.res.linear.numChannels = 1;
  res.res.linear.sizeInBytes = kN * 4;
  CUDA_TEXTURE_DESC td{};
  td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = CU_TR_ADDRESS_MODE_CLAMP;
  td.filterMode = CU_TR_FILTER_MODE_POINT;
  td.borderColor[1] = 0.25f;
  CUtexObject t_lin, t_img;
  CHECK(cuTexObjectCreate(&t_lin, &res, &td, nullptr));
  CUDA_RESOURCE_DESC ares{};
  ares.resType = CU_RESOURCE_TYPE_ARRAY;
  ares.res.array.hArray = image;
  CHECK(cuTexObjectCreate(&t_img, &ares, &td, nullptr));
  ares.res.array.hArray = canvas;
  CUsurfObject s_canvas;
  CHECK(cuSurfObjectCreate(&s_canvas, &ares));
  std::vector<unsigned long long> table_words(8, 0);
  table_words[0] = t_lin;
  table_words[1] = 12345;  // data beside the handle
  CHECK(cuMemcpyHtoD(handles, table_words.data(), 64));

  int n = kN;
  void* sample_args[] = {&t_lin, &t_img, &s_canvas, &out, &n};
  CHECK(cuLaunchKernel(sample, 1, 1, 1, kN, 1, 1, 0, nullptr, sample_args, nullptr));
  void* table_args[] = {&handles, &out2, &n};
  CHECK(cuLaunchKernel(table, 1, 1, 1, kN, 1, 1, 0, nullptr, table_args, nullptr));
  CHECK(cuCtxSynchronize());

  std::vector<float> got(kN), got2(kN), painted(kWidth * kHeight);
  CHECK(cuMemcpyDtoH(got.data(), out, kN * 4));
  CHECK(cuMemcpyDtoH(got2.data(), out2, kN * 4));
  array_copy(canvas, painted, false);
  int bad = 0;
  for (int i = 0; i < kN; ++i) {
    const float v = lin[i] + img[(i / kWidth % kHeight) * kWidth + i % kWidth];
    bad += got[i] != v || got2[i] != 2.0f * lin[i] || painted[(i / kWidth % kHeight) * kWidth + i % kWidth] != v;
  }
  CHECK(cuTexObjectDestroy(t_lin));
  CHECK(cuTexObjectDestroy(t_img));
  CHECK(cuSurfObjectDestroy(s_canvas));
  CHECK(cuArrayDestroy(image));
  CHECK(cuArrayDestroy(canvas));
  std::printf("textures_app: %s\n", bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
}
