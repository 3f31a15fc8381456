/* Empty stand-in for curand_mtgp32_kernel.h, which CUDA 13 removed but clang's CUDA wrapper
 * (__clang_cuda_runtime_wrapper.h) still includes. mneme searches this
 * directory last (-idirafter), so a toolkit that ships the header wins. */
