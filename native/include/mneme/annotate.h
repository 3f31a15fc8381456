/* mneme/annotate.h: declare, at record time, how a device buffer's recorded
 * output may be compared at replay (its verification policy).
 *
 *   #include <mneme/annotate.h>
 *   mneme::annotate(d_out, mneme::Metadata{"f32", "relative", 1e-5, "none"});
 *
 * dtype:     element type: "f32", "f64", "f16", "bf16", "i8".."i64", "u8".."u64"
 *            ("float32", "double", "int32"... are accepted too)
 * mode:      "bitwise" (the default policy), "absolute" or "relative" tolerance
 * threshold: the tolerance of the absolute/relative modes
 * norm:      "none" (every element within the tolerance), or the tolerance
 *            applies to the "l1", "l2" or "linf" norm of the difference
 *
 * The call is a no-op when the program does not run under `mneme record`: the
 * recorder's entry point is looked up at run time (dlsym), so nothing links
 * against mneme and the header costs one failed lookup per call otherwise.
 * Annotate after the allocation and before the launches that should carry the
 * policy; the policy stays attached to the allocation containing `ptr`.
 */
#ifndef MNEME_ANNOTATE_H
#define MNEME_ANNOTATE_H

#include <dlfcn.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exported by libmneme_recorder.so. Returns 0 when recorded, nonzero when the
 * pointer is not in a tracked allocation or an argument is invalid. */
typedef int (*mneme_annotate_fn)(const void* ptr, const char* dtype, const char* mode, double threshold,
                                 const char* norm);

static inline int mneme_annotate_c(const void* ptr, const char* dtype, const char* mode, double threshold,
                                   const char* norm) {
  mneme_annotate_fn fn = (mneme_annotate_fn)dlsym(RTLD_DEFAULT, "mneme_annotate_v1");
  return fn ? fn(ptr, dtype, mode, threshold, norm) : 0;
}

#ifdef __cplusplus
}  /* extern "C" */

namespace mneme {

struct Metadata {
  const char* dtype = "u8";
  const char* mode = "bitwise";
  double threshold = 0.0;
  const char* norm = "none";
};

inline int annotate(const void* ptr, const Metadata& m) {
  return mneme_annotate_c(ptr, m.dtype, m.mode, m.threshold, m.norm);
}

}  // namespace mneme
#endif

#endif /* MNEME_ANNOTATE_H */
