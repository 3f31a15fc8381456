"""A small PyTorch program as a new user would record it (issue 23).

Elementwise ops, a 512x512 matmul (cuBLAS: SASS-only GEMM kernels) and a
softmax on the GPU; prints a checksum line. Most of its time is PyTorch's
start-up (import, CUDA context, libraries), which is what module loading
changes.

    python bench/apps/torch_program.py [--steps 3]
"""

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    x = torch.randn(512, 512, device="cuda")
    w = torch.randn(512, 512, device="cuda")
    total = 0.0
    for _ in range(args.steps):
        y = torch.relu(x * 2.0 + 1.0)  # elementwise kernels
        z = y @ w  # cuBLAS GEMM
        p = torch.softmax(z, dim=1)
        total += float(p.sum())
    torch.cuda.synchronize()
    print(f"torch_program: checksum {total:.3f}")


if __name__ == "__main__":
    main()
