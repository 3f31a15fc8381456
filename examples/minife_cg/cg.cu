// A conjugate-gradient solver in the style of MiniFE: the workload whose SpMV
// kernel mneme records, replays and tunes in the headline benchmark.
//
// The matrix is the 27-point operator of an nx*ny*nz structured grid (27 on the
// diagonal, -1 for every neighbour inside the grid), assembled in CSR on the
// host. It is symmetric and strictly diagonally dominant, so CG converges, and
// its spectrum lies in [1, 53], which gives the host check a theoretical bound.
// The right-hand side is b = A * ones, so the exact solution is all ones.
//
// Kernels (all double precision, as MiniFE): spmv_csr (the main kernel, timed
// and reported), dot (block reduction + one atomicAdd per block), waxpby
// (w = alpha*x + beta*y). The iteration count is fixed, as in a benchmark run.
//
// usage: cg [nx [ny nz]] [iterations]      (defaults: 88 88 88, 50 iterations)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "example_util.h"

namespace {

const char* kUsage = "[nx [ny nz]] [iterations]";

// y = A*x, one thread per row, grid-stride so that any launch shape covers the
// matrix (a tuner may change the block size while keeping the recorded grid).
__global__ void spmv_csr(int n, const int* __restrict__ row_ptr, const int* __restrict__ cols,
                         const double* __restrict__ vals, const double* __restrict__ x,
                         double* __restrict__ y) {
  for (int row = blockIdx.x * blockDim.x + threadIdx.x; row < n; row += gridDim.x * blockDim.x) {
    double sum = 0.0;
    for (int k = row_ptr[row]; k < row_ptr[row + 1]; ++k) sum += vals[k] * x[cols[k]];
    y[row] = sum;
  }
}

// result += x.y : each block reduces its grid-stride partial sums (warp
// shuffles, then the warp sums in shared memory) and adds them with one
// atomicAdd. blockDim.x must be a multiple of 32. The atomic order varies from
// run to run, so the last bits of the result may differ between runs.
__global__ void dot(int n, const double* __restrict__ x, const double* __restrict__ y,
                    double* __restrict__ result) {
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

// w = alpha*x + beta*y (w may alias x or y: each element is read before written).
__global__ void waxpby(int n, double alpha, const double* x, double beta, const double* y, double* w) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    w[i] = alpha * x[i] + beta * y[i];
}

struct CsrMatrix {
  int n = 0;
  std::vector<int> row_ptr, cols;
  std::vector<double> vals;
};

// The 27-point operator of the grid, rows in x-fastest order, columns sorted.
CsrMatrix assemble_27pt(int nx, int ny, int nz) {
  CsrMatrix a;
  a.n = nx * ny * nz;
  a.row_ptr.reserve(a.n + 1);
  a.cols.reserve(static_cast<size_t>(a.n) * 27);
  a.vals.reserve(static_cast<size_t>(a.n) * 27);
  a.row_ptr.push_back(0);
  for (int k = 0; k < nz; ++k)
    for (int j = 0; j < ny; ++j)
      for (int i = 0; i < nx; ++i) {
        const int row = (k * ny + j) * nx + i;
        for (int dk = -1; dk <= 1; ++dk)
          for (int dj = -1; dj <= 1; ++dj)
            for (int di = -1; di <= 1; ++di) {
              const int ii = i + di, jj = j + dj, kk = k + dk;
              if (ii < 0 || jj < 0 || kk < 0 || ii >= nx || jj >= ny || kk >= nz) continue;
              const int col = (kk * ny + jj) * nx + ii;
              a.cols.push_back(col);
              a.vals.push_back(col == row ? 27.0 : -1.0);
            }
        a.row_ptr.push_back(static_cast<int>(a.cols.size()));
      }
  return a;
}

std::vector<double> host_spmv(const CsrMatrix& a, const std::vector<double>& x) {
  std::vector<double> y(a.n);
  for (int row = 0; row < a.n; ++row) {
    double sum = 0.0;
    for (int k = a.row_ptr[row]; k < a.row_ptr[row + 1]; ++k) sum += a.vals[k] * x[a.cols[k]];
    y[row] = sum;
  }
  return y;
}

double norm2(const std::vector<double>& v) {
  double s = 0.0;
  for (double e : v) s += e * e;
  return std::sqrt(s);
}

template <typename T>
T* to_device(const std::vector<T>& host) {
  T* dev = nullptr;
  CUDA_CHECK(cudaMalloc(&dev, host.size() * sizeof(T)));
  CUDA_CHECK(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return dev;
}

}  // namespace

int main(int argc, char** argv) {
  const long kMaxSide = 400;  // keeps nnz (about 27 * nx*ny*nz) inside int32
  const int nx = (int)example::arg_or(argc, argv, 1, 88, kMaxSide, "nx", kUsage);
  const int ny = argc > 3 ? (int)example::arg_or(argc, argv, 2, 88, kMaxSide, "ny", kUsage) : nx;
  const int nz = argc > 3 ? (int)example::arg_or(argc, argv, 3, 88, kMaxSide, "nz", kUsage) : nx;
  const int it_index = argc == 3 ? 2 : 4;
  const int iterations = (int)example::arg_or(argc, argv, it_index, 50, 100000, "iterations", kUsage);
  if ((long)nx * ny * nz * 27 > INT32_MAX) {
    std::fprintf(stderr, "error: the grid %dx%dx%d has too many nonzeros for int32 CSR indices\n", nx, ny, nz);
    return 2;
  }

  const CsrMatrix a = assemble_27pt(nx, ny, nz);
  const int n = a.n;
  const std::vector<double> ones(n, 1.0);
  const std::vector<double> b = host_spmv(a, ones);  // exact: integer sums
  std::printf("minife_cg: grid %dx%dx%d, %d rows, %zu nonzeros, %d iterations\n", nx, ny, nz, n,
              a.vals.size(), iterations);

  int* d_row_ptr = to_device(a.row_ptr);
  int* d_cols = to_device(a.cols);
  double* d_vals = to_device(a.vals);
  double* d_b = to_device(b);
  double* d_x = to_device(std::vector<double>(n, 0.0));
  double *d_r, *d_p, *d_Ap, *d_dot;
  CUDA_CHECK(cudaMalloc(&d_r, n * sizeof(double)));
  CUDA_CHECK(cudaMalloc(&d_p, n * sizeof(double)));
  CUDA_CHECK(cudaMalloc(&d_Ap, n * sizeof(double)));
  CUDA_CHECK(cudaMalloc(&d_dot, sizeof(double)));

  const int block = 256;
  const int grid_rows = (n + block - 1) / block;
  const int grid_vec = grid_rows < 1024 ? grid_rows : 1024;
  example::KernelTimer spmv_timer("spmv_csr"), dot_timer("dot"), waxpby_timer("waxpby");

  auto spmv = [&](const double* x, double* y) {
    spmv_timer.start();
    spmv_csr<<<grid_rows, block>>>(n, d_row_ptr, d_cols, d_vals, x, y);
    spmv_timer.stop();
    CUDA_CHECK_LAUNCH();
  };
  auto dot_product = [&](const double* x, const double* y) {
    CUDA_CHECK(cudaMemsetAsync(d_dot, 0, sizeof(double)));
    dot_timer.start();
    dot<<<grid_vec, block>>>(n, x, y, d_dot);
    dot_timer.stop();
    CUDA_CHECK_LAUNCH();
    double value = 0.0;
    CUDA_CHECK(cudaMemcpy(&value, d_dot, sizeof(double), cudaMemcpyDeviceToHost));
    return value;
  };
  auto axpby = [&](double alpha, const double* x, double beta, const double* y, double* w) {
    waxpby_timer.start();
    waxpby<<<grid_vec, block>>>(n, alpha, x, beta, y, w);
    waxpby_timer.stop();
    CUDA_CHECK_LAUNCH();
  };

  // r = b - A*x0; p = r
  spmv(d_x, d_Ap);
  axpby(1.0, d_b, -1.0, d_Ap, d_r);
  axpby(1.0, d_r, 0.0, d_r, d_p);
  double rr = dot_product(d_r, d_r);
  for (int it = 0; it < iterations; ++it) {
    spmv(d_p, d_Ap);
    const double pAp = dot_product(d_p, d_Ap);
    const double alpha = rr / pAp;
    axpby(1.0, d_x, alpha, d_p, d_x);
    axpby(1.0, d_r, -alpha, d_Ap, d_r);
    const double rr_new = dot_product(d_r, d_r);
    axpby(1.0, d_r, rr_new / rr, d_p, d_p);
    rr = rr_new;
  }
  CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<double> x(n);
  CUDA_CHECK(cudaMemcpy(x.data(), d_x, n * sizeof(double), cudaMemcpyDeviceToHost));
  spmv_timer.report();
  dot_timer.report();
  waxpby_timer.report();

  // Host check: the true residual of the device's x, recomputed here, must
  // (1) agree with the residual the solver's recurrence reached and (2) lie
  // under CG's convergence bound 2*sqrt(kappa)*((sqrt(kappa)-1)/(sqrt(kappa)+1))^k
  // for kappa <= 53, with a floor for rounding.
  std::vector<double> ax = host_spmv(a, x);
  std::vector<double> residual(n);
  for (int i = 0; i < n; ++i) residual[i] = b[i] - ax[i];
  const double b_norm = norm2(b);
  const double true_rel = norm2(residual) / b_norm;
  const double recurrence_rel = std::sqrt(std::fabs(rr)) / b_norm;
  const double kappa = 53.0, rate = (std::sqrt(kappa) - 1.0) / (std::sqrt(kappa) + 1.0);
  const double bound = 2.0 * std::sqrt(kappa) * std::pow(rate, iterations) + 1e-12;
  std::printf("residual: true %.3e, recurrence %.3e, bound %.3e\n", true_rel, recurrence_rel, bound);

  char reason[256] = "";
  bool ok = std::isfinite(true_rel) && std::isfinite(recurrence_rel);
  if (!ok) {
    std::snprintf(reason, sizeof reason, "the residual is not finite (true %g, recurrence %g)", true_rel,
                  recurrence_rel);
  } else if (std::fabs(true_rel - recurrence_rel) > 1e-6 * (true_rel + 1e-6)) {
    ok = false;
    std::snprintf(reason, sizeof reason, "true residual %.3e disagrees with the solver's %.3e", true_rel,
                  recurrence_rel);
  } else if (true_rel > bound) {
    ok = false;
    std::snprintf(reason, sizeof reason, "residual %.3e is above the CG bound %.3e after %d iterations",
                  true_rel, bound, iterations);
  }

  cudaFree(d_row_ptr);
  cudaFree(d_cols);
  cudaFree(d_vals);
  cudaFree(d_b);
  cudaFree(d_x);
  cudaFree(d_r);
  cudaFree(d_p);
  cudaFree(d_Ap);
  cudaFree(d_dot);
  return example::verdict(ok, reason);
}
