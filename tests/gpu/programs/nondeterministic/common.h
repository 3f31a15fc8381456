// Shared by the nondeterministic test programs: error checks and a fixed pseudo-random fill.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <vector>
#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } } while (0)

// Values in [lo, hi) from a fixed LCG: the recordings are the same every run.
inline std::vector<float> fill(size_t n, float lo, float hi, unsigned seed) {
    std::vector<float> v(n);
    unsigned s = seed;
    for (auto& x : v) { s = s * 1664525u + 1013904223u; x = lo + (hi - lo) * ((s >> 8) / 16777216.0f); }
    return v;
}

template <typename T> T* to_device(const std::vector<T>& h) {
    T* d = nullptr;
    CHECK(cudaMalloc(&d, h.size() * sizeof(T)));
    CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
