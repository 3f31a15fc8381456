"""Optuna's storage proxy service as plain functions: what a study server runs for each of its calls."""

from __future__ import annotations

from typing import Any, Callable

from mneme.errors import ConfigurationError


class Aborted(Exception):
    """``context.abort`` of a synchronous handler, carried out to the asyncio call."""


class SyncContext:
    """What Optuna's servicer uses of a ``grpc.ServicerContext``: ``abort``."""

    def abort(self, code: Any, details: str = "") -> None:
        raise Aborted(code, details)


def optuna_methods(storage: Any) -> dict[str, tuple[Callable[[bytes], Any], Callable[[Any, Any], Any], Callable[[Any], bytes]]]:
    """Optuna's ``StorageService`` over ``storage``, per method path (``/SERVICE/METHOD``): its request deserializer, its synchronous
    function (``(request, context)``; ``context.abort`` raises :class:`Aborted`) and its response serializer."""
    try:
        from optuna.storages._grpc.auto_generated import api_pb2
        from optuna.storages._grpc.servicer import OptunaStorageProxyService
    except ImportError as exc:  # optuna < 4.2
        raise ConfigurationError(f"Optuna's storage proxy is missing ({exc}); pip install 'optuna>=4.2'") from None
    servicer = OptunaStorageProxyService(storage)
    service = api_pb2.DESCRIPTOR.services_by_name["StorageService"]
    return {f"/{service.full_name}/{m.name}": (getattr(api_pb2, m.input_type.name).FromString,
                                               getattr(servicer, m.name),
                                               getattr(api_pb2, m.output_type.name).SerializeToString)
            for m in service.methods}
