"""Prometheus metrics of one replay server (names follow Prometheus conventions).

Each server owns its registry, so several servers (or tests) can live in one
process without colliding in the global registry. The registry also carries
prometheus-client's process, platform and garbage-collector collectors
(``process_*``, ``python_info``, ``python_gc_*``), as the default registry would.
"""

from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    start_http_server,
)

import mneme

OUTCOMES = ("verified", "unverified", "failed", "timeout")

# Replays of small kernels take about a millisecond; big ones seconds.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60)
_KERNEL_BUCKETS = (1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1, 5)
_COMPILE_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)


class ServerMetrics:
    """The metric families a replay server exports on /metrics."""

    def __init__(self, gpu: int, engine: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):  # process_*, python_*
            r.register(collector)
        self.replays = Counter(
            "mneme_replays", "Replays completed, by outcome", ["outcome"], registry=r
        )
        for outcome in OUTCOMES:
            self.replays.labels(outcome)  # export zeros from the start
        self.cancelled = Counter(
            "mneme_requests_cancelled", "Queued replays dropped because their caller cancelled", registry=r
        )
        self.replay_latency = Histogram(
            "mneme_replay_latency_seconds", "Time from request arrival to result, queueing included",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.kernel_time = Histogram(
            "mneme_kernel_time_seconds", "Mean measured kernel time of executed replays",
            buckets=_KERNEL_BUCKETS, registry=r,
        )
        self.compile_time = Histogram(
            "mneme_compile_seconds", "Compile time in the CPU compile pool", buckets=_COMPILE_BUCKETS, registry=r
        )
        self.compile_hits = Counter("mneme_compile_cache_hits", "Compile cache hits", registry=r)
        self.compile_misses = Counter("mneme_compile_cache_misses", "Compile cache misses", registry=r)
        self.queue_depth = Gauge("mneme_queue_depth", "Replays waiting for a worker", registry=r)
        self.in_flight = Gauge("mneme_in_flight", "Replays handed to workers and not finished", registry=r)
        self.worker_restarts = Counter(
            "mneme_worker_restarts", "Worker processes replaced after a crash, fault or hang", registry=r
        )
        self.workers_ready = Gauge("mneme_workers_ready", "Worker processes that passed their self-test", registry=r)
        self.prepared_bytes = Gauge(
            "mneme_prepared_instance_bytes", "Device memory held by prepared instances", registry=r
        )
        self.build_info = Info("mneme_build", "Build of this replay server", registry=r)
        self.build_info.info({"version": mneme.__version__, "gpu": str(gpu), "engine": engine})

    def count_result(self, status: str, failed: bool, verified: bool, count: int = 1) -> None:
        if status == "timeout":
            outcome = "timeout"
        elif verified:
            outcome = "verified"
        elif failed:
            outcome = "failed"
        else:
            outcome = "unverified"
        self.replays.labels(outcome).inc(count)

    def serve_http(self, port: int, addr: str = "127.0.0.1") -> None:
        """Expose /metrics over HTTP (prometheus-client's own server thread).

        Args:
            port: the TCP port (0: a free one).
            addr: the address to bind: an IPv4 or IPv6 address (``::`` or ``0.0.0.0`` for all).

        Returns:
            None; ``http_port`` is the bound port afterwards.
        """
        started = start_http_server(port, addr=addr, registry=self.registry)
        self._http = started[0] if isinstance(started, tuple) else None  # (server, thread) since 0.17
        self.http_port = self._http.server_address[1] if self._http is not None else port

    def stop_http(self) -> None:
        http = getattr(self, "_http", None)
        if http is not None:
            http.shutdown()
            http.server_close()
            self._http = None
