// One `template __global__` kernel instantiated twice (float with radius 1, int
// with radius 2): two kernels, two recordings, each replayed on its own.
#include "corpus.h"

template <typename T, int R>
__global__ void box_blur(const T* in, T* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    T s = 0;
    for (int k = -R; k <= R; ++k) s += in[min(max(i + k, 0), n - 1)];
    out[i] = s / T(2 * R + 1);
}

int main() {
    const int n = 1 << 13;
    std::vector<float> hf = fill(n, 0.0f, 3.0f, 4);
    std::vector<int> hi(n);
    for (int i = 0; i < n; ++i) hi[i] = (i * 31) % 101;
    float *fin = to_device(hf), *fout = to_device(std::vector<float>(n, 0.0f));
    int *iin = to_device(hi), *iout = to_device(std::vector<int>(n, 0));
    box_blur<float, 1><<<n / 256, 256>>>(fin, fout, n);
    box_blur<int, 2><<<n / 128, 128>>>(iin, iout, n);
    std::vector<float> gf = to_host(fout, n);
    std::vector<int> gi = to_host(iout, n);
    bool ok = true;
    for (int i = 0; i < n; ++i) {
        float sf = 0.0f;
        int si = 0;
        for (int k = -1; k <= 1; ++k) sf += hf[std::min(std::max(i + k, 0), n - 1)];
        for (int k = -2; k <= 2; ++k) si += hi[std::min(std::max(i + k, 0), n - 1)];
        ok &= close_to(gf[i], sf / 3.0f, 1e-6f) && gi[i] == si / 5;
    }
    return report("templates", ok, "a blur differs from the host's");
}
