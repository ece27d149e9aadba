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
from servetune.api.gateway import PROBE, Caller, Gateway
from servetune.api.grpc.calls import rpc, stream_rpc
from servetune.protos import HEALTH, OIP, TORCHSERVE_INFERENCE, methods

_METHODS = methods(HEALTH)
CheckResponse = _METHODS["Check"].response
ListResponse = _METHODS["List"].response
SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3
WATCH_INTERVAL_S = 1.0
SERVICES = ("", OIP, TORCHSERVE_INFERENCE, HEALTH)


class Health:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def status(self, service: str) -> int | None:
        """SERVING or NOT_SERVING; None for a name that is neither a service here nor a model."""
        if service in SERVICES:
            return SERVING if await self.gateway.server_ready() else NOT_SERVING
        if service in self.gateway.model_names():
            try:
                ready = await self.gateway.model_ready(service, None)
            except ApiError:
                ready = False
            return SERVING if ready else NOT_SERVING
        return None

    @rpc(PROBE)
    async def Check(self, request: Any, context: grpc.aio.ServicerContext, who: Caller) -> Any:  # noqa: N802 - RPC name
        status = await self.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return CheckResponse(status=status)

    @rpc(PROBE)
    async def List(self, request: Any, context: grpc.aio.ServicerContext, who: Caller) -> Any:  # noqa: N802
        response = ListResponse()
        for service in SERVICES:
            response.statuses[service].status = await self.status(service) or SERVICE_UNKNOWN
        return response

    @stream_rpc(PROBE)
    async def Watch(  # noqa: N802
        self, request: Any, context: grpc.aio.ServicerContext, who: Caller
    ) -> AsyncIterator[Any]:
        last = -1
        while True:
            status = await self.status(request.service) or SERVICE_UNKNOWN
            if status != last:
                last = status
                yield CheckResponse(status=status)
            await asyncio.sleep(WATCH_INTERVAL_S)


__all__ = ["Health"]
