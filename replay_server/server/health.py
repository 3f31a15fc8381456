"""The standard grpc.health.v1 service, fed by the worker pool's state.

Load balancers and `grpc_health_probe` ask it; the server reports
NOT_SERVING once no worker can start, instead of respawning forever.
"""

from __future__ import annotations

import threading

import grpc

from replay_server.protocol import health_pb2, health_pb2_grpc

SERVICE_NAME = "mneme.v1.ReplayService"
_Status = health_pb2.HealthCheckResponse.ServingStatus


class HealthService(health_pb2_grpc.HealthServicer):
    def __init__(self) -> None:
        self._status = {"": _Status.Value("SERVING"), SERVICE_NAME: _Status.Value("SERVING")}
        self._changed = threading.Condition()

    def set_serving(self, serving: bool) -> None:
        status = _Status.Value("SERVING" if serving else "NOT_SERVING")
        with self._changed:
            if all(v == status for v in self._status.values()):
                return
            for name in self._status:
                self._status[name] = status
            self._changed.notify_all()

    def status(self, service: str = "") -> int | None:
        return self._status.get(service)

    def Check(self, request, context):
        status = self._status.get(request.service)
        if status is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    def Watch(self, request, context):
        last = None
        while context.is_active():
            status = self._status.get(request.service, _Status.Value("SERVICE_UNKNOWN"))
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status)
            with self._changed:
                self._changed.wait(0.5)
