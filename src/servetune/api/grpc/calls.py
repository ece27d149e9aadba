"""The gRPC side of the gateway (``servetune.api.gateway``): how a call reaches it and how its errors go back, for
every gRPC service (TorchServe's inference and management services, the OIP's, ``grpc.health.v1``).

- :func:`rpc` / :func:`stream_rpc`: an RPC method with its :data:`~servetune.api.gateway.Access`. The token is
  checked first (a refused one is UNAUTHENTICATED); an ApiError becomes its gRPC status (``status.py``) and a bug
  INTERNAL, never UNKNOWN; the status sent is counted by the gateway.
- :func:`caller`: the ``authorization`` and ``x-request-id`` metadata, whether the call was cancelled, and its
  deadline (the request's typed deadline: the batcher drops it once the client stopped waiting).
- :func:`handler_headers`: the call's metadata as a handler's headers, less gRPC's own transport fields and the key.
- :func:`send_timing`: where the answer's time went, as trailing metadata (REST sends the same as headers).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

import grpc

from servetune._exceptions import ApiError
from servetune.api.gateway import Access, Answer, Caller, Gateway
from servetune.api.grpc.status import abort

log = logging.getLogger("servetune.grpc")

# Metadata a handler never sees as a request header: the key, and gRPC's own transport fields.
HIDDEN_METADATA = frozenset({"authorization", "user-agent", "grpc-accept-encoding", "grpc-encoding", "grpc-timeout"})


class Service(Protocol):
    """A gRPC service of the API: its methods reach the gateway through ``self.gateway``."""

    gateway: Gateway


S = TypeVar("S", bound=Service)
R = TypeVar("R")
Method = Callable[[S, Any, grpc.aio.ServicerContext, Caller], Awaitable[R]]
StreamMethod = Callable[[S, Any, grpc.aio.ServicerContext, Caller], AsyncIterator[R]]
Unary = Callable[[S, Any, grpc.aio.ServicerContext], Awaitable[R]]
Streaming = Callable[[S, Any, grpc.aio.ServicerContext], AsyncIterator[R]]


def metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's text metadata (binary ``-bin`` entries left out), keys lower-case."""
    return {str(k).lower(): v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}


def caller(context: grpc.aio.ServicerContext, received: float) -> Caller:
    """What the call's metadata and deadline say of its caller."""
    meta = metadata(context)
    remaining = context.time_remaining()
    deadline = time.monotonic() + remaining if remaining is not None else None
    return Caller(received, meta.get("authorization"), meta.get("x-request-id"), _cancelled(context), deadline)


def handler_headers(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's metadata as the handler's headers (``explain`` and the like: the worker drops the server's)."""
    return {k: v for k, v in metadata(context).items() if k not in HIDDEN_METADATA}


def send_timing(context: grpc.aio.ServicerContext, answer: Answer) -> None:
    """Where the answer's time went, as trailing metadata."""
    context.set_trailing_metadata(answer.timing())


def _cancelled(context: Any) -> Callable[[], bool]:
    return lambda: bool(context.cancelled())


def version_or_none(version: str) -> str | None:
    """Protobuf's empty string is "not given": the default version."""
    return version or None


def _internal(name: str) -> str:
    log.exception("gRPC %s failed", name)
    return "Internal server error"


def rpc(access: Access) -> Callable[[Method[S, R]], Unary[S, R]]:
    """A unary RPC method ``(self, request, context, caller)`` through the gateway (see the module)."""

    def wrap(method: Method[S, R]) -> Unary[S, R]:
        @functools.wraps(method)
        async def call(self: S, request: Any, context: grpc.aio.ServicerContext) -> R:
            gateway = self.gateway
            who = caller(context, time.perf_counter())
            try:
                gateway.authorize(access, who.authorization)
            except ApiError as exc:
                await abort(context, exc)
            try:
                answer = await method(self, request, context, who)
            except (grpc.aio.AbortError, asyncio.CancelledError):
                raise
            except ApiError as exc:
                gateway.count(access, exc.status)
                await abort(context, exc)
            except Exception:  # noqa: BLE001 - a bug of ours: INTERNAL, logged, rather than UNKNOWN
                await context.abort(grpc.StatusCode.INTERNAL, _internal(method.__name__))
            else:
                gateway.count(access, 200)
                return answer
            raise AssertionError("unreachable: context.abort raises")

        return call

    return wrap


def stream_rpc(access: Access) -> Callable[[StreamMethod[S, R]], Streaming[S, R]]:
    """:func:`rpc` for a server-streaming RPC method (an async generator)."""

    def wrap(method: StreamMethod[S, R]) -> Streaming[S, R]:
        @functools.wraps(method)
        async def call(self: S, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[R]:
            gateway = self.gateway
            who = caller(context, time.perf_counter())
            try:
                gateway.authorize(access, who.authorization)
            except ApiError as exc:
                await abort(context, exc)
            try:
                async for item in method(self, request, context, who):
                    yield item
            except (grpc.aio.AbortError, asyncio.CancelledError):
                raise
            except ApiError as exc:
                gateway.count(access, exc.status)
                await abort(context, exc)
            except Exception:  # noqa: BLE001
                await context.abort(grpc.StatusCode.INTERNAL, _internal(method.__name__))
            else:
                gateway.count(access, 200)

        return call

    return wrap


__all__ = [
    "HIDDEN_METADATA",
    "Service",
    "caller",
    "handler_headers",
    "metadata",
    "rpc",
    "send_timing",
    "stream_rpc",
    "version_or_none",
]
