"""The server side: ``mneme serve``, one process per GPU.

The supervisor (``serve``, ``service``, ``worker_pool``, ``jobs``, ``compile_cache``, ``metrics``,
``health``, ``idle``, ``auth``, ``parent``) holds the gRPC service, the job queue, the compile pool
and its cache, the metrics and the health state; worker processes (``worker``, ``prepared_cache``)
own the CUDA context through an engine (``engine``: the interface, ``engines``: the choice,
``cuda_engine``: the real one). A configuration that faults or hangs kills only a worker, which is
replaced. ``cli`` is the command line. See docs/serving.md.
"""
