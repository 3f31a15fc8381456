"""A small Triton program (issue 23): one ``@triton.jit`` vector-add kernel, launched a few times.

Triton compiles the kernel to PTX and a cubin (kept in its cache,
``~/.triton/cache`` or ``$TRITON_CACHE_DIR``) and loads the cubin with
``cuModuleLoadData``; prints a check line.

    python bench/apps/triton_program.py [--n 1048576] [--steps 3]
"""

import argparse

import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    x = torch.arange(args.n, device="cuda", dtype=torch.float32)
    y = torch.full((args.n,), 0.5, device="cuda")
    out = torch.empty_like(x)
    for step in range(args.steps):
        add_kernel[(triton.cdiv(args.n, 1024),)](x, y, out, args.n, BLOCK=1024)
        x = out + step  # a new input each step: distinct instances
    torch.cuda.synchronize()
    print(f"triton_program: out[-1] = {float(out[-1]):.1f}")


if __name__ == "__main__":
    main()
