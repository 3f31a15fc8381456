// Where a module's code came from, under lazy module loading.
//
// With CUDA_MODULE_LOADING=LAZY (the driver's default) a library or module is
// loaded into a context only when one of its kernels is first launched: the
// CUPTI module-loaded callback then comes inside that launch, long after the
// application's load call. The recorder remembers each load call's image (the
// fatbin with the PTX, or the PTX/cubin) by library or module handle, so the
// module's source can still be written when it is loaded; and it can load the
// function of a launch itself, so that its parameter layout is known at the
// launch's first callback.
#pragma once
#include <cuda.h>

namespace mneme::rec {

// At the exit of a successful cuLibraryLoadData / cuModuleLoadData(Ex) /
// cuModuleLoadFatBinary. A library's image is kept by address (cudart's
// fatbins are static data of the program); a module's image is copied when
// small (frameworks such as Triton free their cubin after the load call).
void remember_library_image(CUlibrary library, const void* image);
void remember_module_image(CUmodule module, const void* image);

// The image the kernel handle `f` (a CUfunction, or a CUkernel as cudart
// passes it) was loaded from; nullptr when unknown. Called at a launch's enter
// callback (it calls the driver), never inside the module-loaded callback.
const void* image_of_function(CUfunction f);

// Loads `f` into the current context (a no-op when it is loaded): the
// module-loaded callback runs inside this call, on this thread.
void load_function(CUfunction f);

}  // namespace mneme::rec
