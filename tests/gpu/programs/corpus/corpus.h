// Shared by the corpus programs (tests/gpu/test_corpus.py): the error check, fixed
// pseudo-random fill and upload of the nondeterministic programs, a download, and
// the one line each program prints when its own check passes.
#pragma once
#include <cmath>

#include "../nondeterministic/common.h"

template <typename T> std::vector<T> to_host(const T* d, size_t n) {
    std::vector<T> h(n);
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

// "<name>: ok" (exit 0) or "<name>: WRONG <what>" (exit 1): the test reads the first.
inline int report(const char* name, bool ok, const char* what = "") {
    CHECK(cudaDeviceSynchronize());
    std::printf("%s: %s%s%s\n", name, ok ? "ok" : "WRONG", ok ? "" : " ", ok ? "" : what);
    return ok ? 0 : 1;
}

inline bool close_to(float a, float b, float rel) { return std::fabs(a - b) <= rel * (std::fabs(b) + 1e-6f); }
