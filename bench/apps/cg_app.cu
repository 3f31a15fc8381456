// An application-scale CG solver for bench/record_overhead.py --app-scale: the
// kernels of examples/minife_cg (spmv_csr, dot, waxpby) on a 27-point operator
// assembled on the device (27 slots per row, padded with zeros at the
// boundary), so GBs of device state cost no host time. CG restarts every 200
// iterations (x = 0, r = b, p = r) so that long runs stay finite. Device state:
// about 368 bytes per row (nx^3 rows): nx=230 is 4.5 GB.
//
// usage: cg_app NX ITERATIONS      prints one JSON line: rows, state_bytes, main_ms, residual
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(call)                                                                          \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "cg_app: %s failed: %s\n", #call, cudaGetErrorString(e_));       \
      std::exit(2);                                                                          \
    }                                                                                        \
  } while (0)

__global__ void assemble(int nx, int* row_ptr, int* cols, double* vals, double* b) {
  const long n = (long)nx * nx * nx;
  for (long row = blockIdx.x * (long)blockDim.x + threadIdx.x; row < n; row += (long)gridDim.x * blockDim.x) {
    const int i = row % nx, j = (row / nx) % nx, k = row / ((long)nx * nx);
    int slot = 0;
    double sum = 0.0;
    for (int dk = -1; dk <= 1; ++dk)
      for (int dj = -1; dj <= 1; ++dj)
        for (int di = -1; di <= 1; ++di, ++slot) {
          const int ii = i + di, jj = j + dj, kk = k + dk;
          const bool inside = ii >= 0 && jj >= 0 && kk >= 0 && ii < nx && jj < nx && kk < nx;
          const long col = inside ? ((long)kk * nx + jj) * nx + ii : row;
          const double v = !inside ? 0.0 : col == row ? 27.0 : -1.0;
          cols[row * 27 + slot] = (int)col;
          vals[row * 27 + slot] = v;
          sum += v;
        }
    row_ptr[row] = (int)(row * 27);
    if (row == n - 1) row_ptr[n] = (int)(n * 27);
    b[row] = sum;  // b = A * ones: the exact solution is all ones
  }
}

__global__ void spmv_csr(int n, const int* __restrict__ row_ptr, const int* __restrict__ cols,
                         const double* __restrict__ vals, const double* __restrict__ x, double* __restrict__ y) {
  for (int row = blockIdx.x * blockDim.x + threadIdx.x; row < n; row += gridDim.x * blockDim.x) {
    double sum = 0.0;
    for (int k = row_ptr[row]; k < row_ptr[row + 1]; ++k) sum += vals[k] * x[cols[k]];
    y[row] = sum;
  }
}

__global__ void dot(int n, const double* __restrict__ x, const double* __restrict__ y, double* __restrict__ result) {
  __shared__ double warp_sums[32];
  double sum = 0.0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) sum += x[i] * y[i];
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    sum = lane < (int)(blockDim.x / 32) ? warp_sums[lane] : 0.0;
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (lane == 0) atomicAdd(result, sum);
  }
}

__global__ void waxpby(int n, double alpha, const double* x, double beta, const double* y, double* w) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) w[i] = alpha * x[i] + beta * y[i];
}

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s NX ITERATIONS\n", argv[0]);
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const int nx = std::atoi(argv[1]), iterations = std::atoi(argv[2]);
  const long rows = (long)nx * nx * nx;
  if (nx < 3 || rows * 27 >= 2147483647L || iterations < 1) {
    std::fprintf(stderr, "cg_app: NX must be 3..430 and ITERATIONS positive\n");
    return 2;
  }
  const int n = (int)rows;
  int *row_ptr, *cols;
  double *vals, *b, *x, *r, *p, *ap, *d_dot;
  CHECK(cudaMalloc(&row_ptr, (rows + 1) * sizeof(int)));
  CHECK(cudaMalloc(&cols, rows * 27 * sizeof(int)));
  CHECK(cudaMalloc(&vals, rows * 27 * sizeof(double)));
  for (double** v : {&b, &x, &r, &p, &ap}) {
    CHECK(cudaMalloc(v, rows * sizeof(double)));
    CHECK(cudaMemset(*v, 0, rows * sizeof(double)));
  }
  CHECK(cudaMalloc(&d_dot, sizeof(double)));
  const size_t state = (rows + 1) * 4 + rows * 27 * 12 + 5 * rows * 8 + 8;
  assemble<<<4096, 256>>>(nx, row_ptr, cols, vals, b);
  CHECK(cudaGetLastError());

  const int block = 256, grid_rows = (n + block - 1) / block, grid_vec = grid_rows < 1024 ? grid_rows : 1024;
  auto dot_product = [&](const double* u, const double* v) {
    CHECK(cudaMemsetAsync(d_dot, 0, sizeof(double)));
    dot<<<grid_vec, block>>>(n, u, v, d_dot);
    double value = 0.0;
    CHECK(cudaMemcpy(&value, d_dot, sizeof(double), cudaMemcpyDeviceToHost));
    return value;
  };
  double rr = 0.0, rr0 = 0.0;
  for (int it = 0; it < iterations; ++it) {
    if (it % 200 == 0) {  // (re)start: x = 0, r = b - A*x = b, p = r
      waxpby<<<grid_vec, block>>>(n, 0.0, x, 0.0, x, x);
      waxpby<<<grid_vec, block>>>(n, 1.0, b, 0.0, b, r);
      waxpby<<<grid_vec, block>>>(n, 1.0, r, 0.0, r, p);
      rr = rr0 = dot_product(r, r);
    }
    spmv_csr<<<grid_rows, block>>>(n, row_ptr, cols, vals, p, ap);
    const double alpha = rr / dot_product(p, ap);
    waxpby<<<grid_vec, block>>>(n, 1.0, x, alpha, p, x);
    waxpby<<<grid_vec, block>>>(n, 1.0, r, -alpha, ap, r);
    const double rr_new = dot_product(r, r);
    waxpby<<<grid_vec, block>>>(n, 1.0, r, rr_new / rr, p, p);
    rr = rr_new;
  }
  CHECK(cudaDeviceSynchronize());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"rows\": %ld, \"state_bytes\": %zu, \"iterations\": %d, \"main_ms\": %.1f, \"residual\": %.3e}\n", rows, state,
              iterations, ms, std::sqrt(rr / rr0));
  return std::isfinite(rr) ? 0 : 1;
}
