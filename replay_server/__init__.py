"""Per-GPU gRPC replay server (``mneme serve``).

One server drives one GPU. Its supervisor process holds the gRPC service
(``protos/mneme/v1``), the job queue, the compile pool and its cache, the
metrics and the health state; worker processes own the CUDA context and the
prepared instances, so a configuration that faults or hangs kills only a
worker, which is replaced. See docs/serving.md.
"""
