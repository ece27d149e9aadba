"""``grpc.health.v1.Health`` on the inference gRPC port, for Kubernetes' gRPC probes and grpc_health_probe.

``""`` (the whole server) and the name of any service on the port are SERVING exactly when REST ``/ping`` says
Healthy (start-up models loaded, none failed, every model's minimum of workers ready); a registered model's name is
SERVING when that model's default version is ready (servetune's extension). Watch re-checks every second and sends
each change. Token-checked as ``/ping`` is (only with ``inference_token_authorization=true``, unless ``open_ping``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from servetune._exceptions import ApiError
from servetune.api.grpc.calls import Served
from servetune.api.grpc.status import streaming, unary
from servetune.protos import HEALTH, OIP, TORCHSERVE_INFERENCE, methods

_METHODS = methods(HEALTH)
CheckResponse = _METHODS["Check"].response
ListResponse = _METHODS["List"].response
SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3
WATCH_INTERVAL_S = 1.0
SERVICES = ("", OIP, TORCHSERVE_INFERENCE, HEALTH)


class Health:
    def __init__(self, served: Served) -> None:
        self.served = served

    async def status(self, service: str) -> int | None:
        """SERVING or NOT_SERVING; None for a name that is neither a service here nor a model."""
        if service in SERVICES:
            return SERVING if await self.served.healthy() else NOT_SERVING
        if any(ref.name == service for ref in self.served.backend.models()):
            try:
                ready = await self.served.backend.ready(service, None)
            except ApiError:
                ready = False
            return SERVING if ready else NOT_SERVING
        return None

    @unary
    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802 - the RPC's name
        await self.served.authorize(context, "ping")
        status = await self.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return CheckResponse(status=status)

    @unary
    async def List(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await self.served.authorize(context, "ping")
        response = ListResponse()
        for service in SERVICES:
            response.statuses[service].status = await self.status(service) or SERVICE_UNKNOWN
        return response

    @streaming
    async def Watch(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:  # noqa: N802
        await self.served.authorize(context, "ping")
        last = -1
        while True:
            status = await self.status(request.service) or SERVICE_UNKNOWN
            if status != last:
                last = status
                yield CheckResponse(status=status)
            await asyncio.sleep(WATCH_INTERVAL_S)


__all__ = ["Health"]
