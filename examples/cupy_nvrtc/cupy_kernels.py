"""CuPy example: kernels compiled at run time by NVRTC and launched from Python.

This is the workload for Python users: no nvcc build, the kernels are CUDA C
strings compiled by NVRTC inside the process (``cupy.RawKernel`` and
``cupy.RawModule``), loaded with ``cuModuleLoadData`` and launched with
``cuLaunchKernel``. It is what mneme has to record from a module that never
existed as a file. Record it with::

    mneme record -rdb DIR -- python examples/cupy_nvrtc/cupy_kernels.py

Kernels:

* ``scale_add`` (a ``RawKernel``): ``y = alpha * x + y`` over a float32 vector.
* ``row_softmax<float>`` (a ``RawModule`` with a C++ template, instantiated
  through ``name_expressions``): one block per row, max and sum reduced in
  shared memory. This is the main kernel, timed with CUDA events.

The results are checked against NumPy on the host. Like the CUDA examples it
prints ``KERNEL_TIME kernel=row_softmax ...`` and then ``PASS`` or
``FAIL: reason``; exit status 0 on success, 1 on a wrong result, 2 on bad
arguments, and 77 (the usual "skipped" status) where CuPy is not installed.

usage: python cupy_kernels.py [--rows N] [--cols N] [--repetitions N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Sequence

SKIP_EXIT_STATUS = 77

SCALE_ADD_SOURCE = r"""
extern "C" __global__ void scale_add(const float* __restrict__ x, float* __restrict__ y,
                                     float alpha, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        y[i] = alpha * x[i] + y[i];
    }
}
"""

# One block per row; blockDim.x must be a power of two (the tree reduction).
ROW_SOFTMAX_SOURCE = r"""
template <typename T>
__global__ void row_softmax(const T* __restrict__ in, T* __restrict__ out, int cols) {
    extern __shared__ float scratch[];
    const T* row_in = in + (size_t)blockIdx.x * cols;
    T* row_out = out + (size_t)blockIdx.x * cols;

    float local_max = -3.402823466e38f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) local_max = fmaxf(local_max, (float)row_in[c]);
    scratch[threadIdx.x] = local_max;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) scratch[threadIdx.x] = fmaxf(scratch[threadIdx.x], scratch[threadIdx.x + stride]);
        __syncthreads();
    }
    const float row_max = scratch[0];
    __syncthreads();

    float local_sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) local_sum += __expf((float)row_in[c] - row_max);
    scratch[threadIdx.x] = local_sum;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) scratch[threadIdx.x] += scratch[threadIdx.x + stride];
        __syncthreads();
    }
    const float inv_sum = 1.0f / scratch[0];
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        row_out[c] = (T)(__expf((float)row_in[c] - row_max) * inv_sum);
}
"""

ROW_SOFTMAX_NAME = "row_softmax<float>"
SOFTMAX_BLOCK = 256


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="NVRTC kernels launched through CuPy, checked against NumPy.")
    parser.add_argument("--rows", type=_positive, default=8192, help="softmax rows (default 8192)")
    parser.add_argument("--cols", type=_positive, default=1024, help="softmax columns (default 1024)")
    parser.add_argument("--repetitions", type=_positive, default=5, help="timed softmax launches (default 5)")
    return parser.parse_args(argv)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def import_cupy():
    """CuPy, or None when it is not installed (the example then reports a skip)."""
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def report_kernel_time(name: str, times_ms: Sequence[float]) -> str:
    """The KERNEL_TIME line the CUDA examples print, from per-launch milliseconds."""
    return (
        f"KERNEL_TIME kernel={name} launches={len(times_ms)} mean_us={1000 * statistics.mean(times_ms):.3f} "
        f"median_us={1000 * statistics.median(times_ms):.3f} min_us={1000 * min(times_ms):.3f}"
    )


def run(cp, args: argparse.Namespace) -> tuple[bool, str]:
    """Launch both kernels, time the softmax, check against NumPy; (ok, reason)."""
    import numpy as np

    rng = np.random.default_rng(7)
    n = args.rows * args.cols
    x_host = rng.standard_normal(n, dtype=np.float32)
    y_host = rng.standard_normal(n, dtype=np.float32)
    alpha = np.float32(0.5)

    scale_add = cp.RawKernel(SCALE_ADD_SOURCE, "scale_add")
    module = cp.RawModule(code=ROW_SOFTMAX_SOURCE, options=("--std=c++17",), name_expressions=[ROW_SOFTMAX_NAME])
    row_softmax = module.get_function(ROW_SOFTMAX_NAME)

    x = cp.asarray(x_host)
    y = cp.asarray(y_host)
    scale_add((min((n + 255) // 256, 4096),), (256,), (x, y, alpha, np.uint64(n)))
    logits = y.reshape(args.rows, args.cols)
    probabilities = cp.empty_like(logits)

    events = []
    shared_bytes = SOFTMAX_BLOCK * 4
    for _ in range(args.repetitions):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        row_softmax(
            (args.rows,), (SOFTMAX_BLOCK,), (logits, probabilities, np.int32(args.cols)), shared_mem=shared_bytes
        )
        stop.record()
        events.append((start, stop))
    cp.cuda.Device().synchronize()
    print(report_kernel_time("row_softmax", [cp.cuda.get_elapsed_time(a, b) for a, b in events]))

    expected_y = alpha * x_host + y_host
    got_y = cp.asnumpy(y)
    if not np.array_equal(got_y, expected_y):
        # alpha*x+y is one rounding on the host; an FMA on the device rounds once too.
        worst = float(np.max(np.abs(got_y - expected_y)))
        if worst > 1e-6 * float(np.max(np.abs(expected_y))):
            return False, f"scale_add differs from NumPy by up to {worst:.3e}"
    shifted = expected_y.reshape(args.rows, args.cols).astype(np.float64)
    shifted -= shifted.max(axis=1, keepdims=True)
    expected_p = np.exp(shifted)
    expected_p /= expected_p.sum(axis=1, keepdims=True)
    got_p = cp.asnumpy(probabilities).astype(np.float64)
    worst = float(np.max(np.abs(got_p - expected_p)))
    row_sums = got_p.sum(axis=1)
    print(f"softmax: max abs error {worst:.3e}, row sums within {float(np.max(np.abs(row_sums - 1))):.3e} of 1")
    if not worst <= 1e-5:
        return False, f"row_softmax differs from NumPy by up to {worst:.3e}"
    return True, ""


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cp = import_cupy()
    if cp is None:
        print(
            "SKIP: CuPy is not installed; install the wheel for your CUDA version "
            "(e.g. pip install cupy-cuda13x) to run this example",
            file=sys.stderr,
        )
        return SKIP_EXIT_STATUS
    print(f"cupy_nvrtc: softmax over {args.rows} x {args.cols} float32, {args.repetitions} repetitions")
    try:
        ok, reason = run(cp, args)
    except cp.cuda.compiler.CompileException as exc:
        print(f"FAIL: NVRTC could not compile a kernel: {exc}")
        return 1
    except Exception as exc:  # CUDA runtime or driver errors: say which, no traceback
        print(f"FAIL: {type(exc).__name__}: {exc} (is a GPU visible to this process?)")
        return 1
    print("PASS" if ok else f"FAIL: {reason}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
