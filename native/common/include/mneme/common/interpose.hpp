// How a preloaded mneme library hands out its own driver entry points. cudart
// (static or shared) and most frameworks reach the driver through
// dlsym(handle, "cuGetProcAddress_v2") and then ask that function for every
// other entry point: the `dlsym` exported here hands out a wrapper of
// cuGetProcAddress, which in turn hands out the library's replacements.
// Programs linked against libcuda directly get the replacements by symbol
// interposition (LD_PRELOAD): the library exports them under the driver's
// names.
//
// interpose.cpp holds the mechanism: the exported `dlsym` and
// `cuGetProcAddress_v2`, the cuGetProcAddress wrappers and the C library's
// dlsym. The library that links native/common defines the functions of
// `mneme::common::interposer` below: which entry points it replaces, and when.
#pragma once
#include <cuda.h>

namespace mneme::common {

// The C library's dlsym (our exported `dlsym` shadows it).
using DlsymFn = void* (*)(void*, const char*);
DlsymFn real_dlsym_function();
void* real_dlsym(void* handle, const char* name);

// Defined by the library (hidden: a library that leaves one out fails to link).
namespace interposer {

// Whether the exported dlsym looks at a driver entry point ("cu..." names)
// now; asked outside the driver's own loading only.
__attribute__((visibility("hidden"))) bool watches_dlsym();

// Whether cuGetProcAddress's answers are replaced now (cuGetProcAddress
// itself by the wrapper, the rest by replace_proc_address).
__attribute__((visibility("hidden"))) bool replaces_proc_addresses();

// cuGetProcAddress answered `symbol` (not cuGetProcAddress) with *pfn (not
// null): sets *pfn to the library's replacement, or leaves it.
__attribute__((visibility("hidden"))) void replace_proc_address(const char* symbol, void** pfn, int version,
                                                                cuuint64_t flags);

// dlsym found `p` (not null) under `name`, a "cu..." name other than
// cuGetProcAddress and cuGetProcAddress_v2: the library's replacement, or p.
__attribute__((visibility("hidden"))) void* replace_symbol(const char* name, void* p);

}  // namespace interposer
}  // namespace mneme::common
