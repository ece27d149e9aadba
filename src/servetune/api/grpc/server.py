"""The gRPC servers: one on the inference gRPC port (TorchServe's ``InferenceAPIsService``, the Open Inference
Protocol's ``inference.GRPCInferenceService`` and ``grpc.health.v1.Health``) and one on the management gRPC port
(TorchServe's ``ManagementAPIsService``), on the API server's event loop, over its backend.

Why the OIP service shares the inference port: gRPC tells services apart by path, so one h2c port serves every
inference protocol, as TorchServe 0.10+ serves its OIP service on 7070; in KServe, point the runtime's ``h2c`` port
(8081 by KServe's convention) at it with ``grpc_inference_port=8081``.

Message limits: ``max_request_size`` bounds what the server receives (gRPC answers RESOURCE_EXHAUSTED beyond it, as
TorchServe sets its inbound limit), ``max_response_size`` what it sends (checked by the services first, so the
caller reads why).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from servetune._exceptions import ApiError, ConfigError
from servetune.api.gateway import Gateway
from servetune.api.grpc.health import Health
from servetune.api.grpc.oip import OipService
from servetune.api.grpc.torchserve import TorchServeInference, TorchServeManagement
from servetune.api.management import Management
from servetune.protos import HEALTH, OIP, TORCHSERVE_INFERENCE, TORCHSERVE_MANAGEMENT, Method, methods

log = logging.getLogger("servetune.grpc")

_HANDLERS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}
RESPONSE_OVERHEAD = 64 * 1024  # framing beyond the answer's bytes: the services refuse an oversize answer first


def service_handler(service: str, implementation: Any) -> grpc.GenericRpcHandler:
    """Every RPC of ``service`` (from servetune's protos) bound to the method of the same name; a request that is
    not a valid protobuf message is INVALID_ARGUMENT (gRPC's own deserializer failure would read UNKNOWN)."""
    table = {
        name: _HANDLERS[(m.client_streaming, m.server_streaming)](
            parsing(getattr(implementation, name), m),
            response_serializer=m.response.SerializeToString,
        )
        for name, m in methods(service).items()
    }
    return grpc.method_handlers_generic_handler(service, table)


def parse(method: Method, raw: bytes) -> Any:
    """One request message of ``method`` from its bytes; raises ``ApiError`` 400 for bytes that are no such message."""
    try:
        return method.request.FromString(raw)
    except DecodeError as exc:
        kind = method.request.DESCRIPTOR.name
        raise ApiError.bad_request(f"the request is not a valid {kind} message ({exc})") from None


def parsing(call: Any, method: Method) -> Any:
    """``call`` taking the request's raw bytes (gRPC passes bytes when no deserializer is given)."""

    async def refuse(context: grpc.aio.ServicerContext, error: ApiError) -> None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, error.message)

    if method.client_streaming:

        async def requests(raw: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for item in raw:
                try:
                    yield parse(method, item)
                except ApiError as exc:
                    await refuse(context, exc)

        if method.server_streaming:

            async def both(raw: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                async for answer in call(requests(raw, context), context):
                    yield answer

            return both

        async def many_to_one(raw: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
            return await call(requests(raw, context), context)

        return many_to_one

    if method.server_streaming:

        async def one_to_many(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                request = parse(method, raw)
            except ApiError as exc:
                await refuse(context, exc)
            async for answer in call(request, context):
                yield answer

        return one_to_many

    async def unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            request = parse(method, raw)
        except ApiError as exc:
            await refuse(context, exc)
        return await call(request, context)

    return unary


@dataclass(frozen=True)
class Port:
    name: str  # the ready file's key: grpc_inference, grpc_management
    host: str
    port: int
    max_connection_age_ms: int
    max_connection_age_grace_ms: int
    services: tuple[tuple[str, Any], ...]


def target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GrpcServers:
    """Bind with :meth:`start` (after the HTTP APIs), read :attr:`urls`, :meth:`stop` in the server's shutdown."""

    def __init__(self, gateway: Gateway, management: Management) -> None:
        self.gateway = gateway
        self.management = management
        self.config = gateway.config
        self.urls: dict[str, str] = {}
        self._servers: list[grpc.aio.Server] = []

    def ports(self) -> list[Port]:
        """The gRPC services, by port: adding a protocol on gRPC is its service module and its line here."""
        config, gateway = self.config, self.gateway
        inference = (
            (TORCHSERVE_INFERENCE, TorchServeInference(gateway)),
            (OIP, OipService(gateway)),
            (HEALTH, Health(gateway)),
        )
        return [
            Port(
                "grpc_inference",
                config.grpc_inference_address,
                config.grpc_inference_port,
                config.grpc_inference_max_connection_age_ms,
                config.grpc_inference_max_connection_age_grace_ms,
                inference,
            ),
            Port(
                "grpc_management",
                config.grpc_management_address,
                config.grpc_management_port,
                config.grpc_management_max_connection_age_ms,
                config.grpc_management_max_connection_age_grace_ms,
                ((TORCHSERVE_MANAGEMENT, TorchServeManagement(gateway, self.management)),),
            ),
        ]

    def options(self, port: Port) -> list[tuple[str, int]]:
        config = self.config
        options = [
            ("grpc.max_receive_message_length", config.max_request_size),
            ("grpc.max_send_message_length", config.max_response_size + RESPONSE_OVERHEAD),
            ("grpc.so_reuseport", 0),  # a port in use is an error, not a second listener
        ]
        if port.max_connection_age_ms:
            options.append(("grpc.max_connection_age_ms", port.max_connection_age_ms))
        if port.max_connection_age_grace_ms:
            options.append(("grpc.max_connection_age_grace_ms", port.max_connection_age_grace_ms))
        return options

    async def start(self) -> dict[str, str]:
        """Bind and start every gRPC server; returns ``{"grpc_inference": "grpc://host:port", ...}``."""
        for port in self.ports():
            server = grpc.aio.server(options=self.options(port))
            server.add_generic_rpc_handlers(tuple(service_handler(name, impl) for name, impl in port.services))
            address = target(port.host, port.port)
            try:
                bound = server.add_insecure_port(address)
            except RuntimeError as exc:  # grpc raises when it cannot bind
                await self.stop(0.0)
                raise ConfigError(f"cannot bind gRPC {port.name} to {address}: {exc}") from None
            await server.start()
            self._servers.append(server)
            self.urls[port.name] = f"grpc://{target(port.host, bound)}"
        return dict(self.urls)

    async def stop(self, grace_s: float) -> None:
        """Refuse new calls, let calls in flight finish within ``grace_s``."""
        servers, self._servers = self._servers, []
        for server in servers:
            await server.stop(grace_s)


__all__ = ["GrpcServers", "Port", "service_handler", "target"]
