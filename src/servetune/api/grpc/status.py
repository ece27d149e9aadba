"""Errors on gRPC: every :class:`ApiError` becomes a gRPC status, with the REST API's message as its details.

The table is TorchServe's (``GRPCUtils.getGRPCStatusCode``: HTTP status -> gRPC code), which agrees with KServe's
mapping for the Open Inference Protocol (400 -> INVALID_ARGUMENT, 404 -> NOT_FOUND, 503 -> UNAVAILABLE, 501 ->
UNIMPLEMENTED). Two additions, so that a caller's error never reads as the server's: 507 (an answer larger than
``max_response_size``) -> RESOURCE_EXHAUSTED, and an unknown model or version is NOT_FOUND on every RPC (TorchServe
answers INTERNAL for it on Predictions). Only a failure of servetune itself is INTERNAL, never UNKNOWN.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from servetune._exceptions import AUTH_FAILED_MESSAGE, ApiError

log = logging.getLogger("servetune.grpc")

CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ABORTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    416: grpc.StatusCode.OUT_OF_RANGE,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
    507: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def code_for(status: int) -> grpc.StatusCode:
    """The gRPC code of an HTTP status (TorchServe's table; other 4xx FAILED_PRECONDITION, other 5xx INTERNAL)."""
    if status in CODES:
        return CODES[status]
    if 200 <= status < 300:
        return grpc.StatusCode.OK
    if 400 <= status < 500:
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INTERNAL


async def abort(context: grpc.aio.ServicerContext, error: ApiError) -> None:
    """End the call with the error's code and message (raises, as ``context.abort`` does)."""
    await context.abort(code_for(error.status), error.message)


async def refuse_token(context: grpc.aio.ServicerContext) -> None:
    """A missing, wrong or expired ``authorization: Bearer`` key: UNAUTHENTICATED with the REST API's message
    (TorchServe answers PERMISSION_DENIED with the same message)."""
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, AUTH_FAILED_MESSAGE)


R = TypeVar("R")
Unary = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]
Streaming = Callable[[Any, Any, grpc.aio.ServicerContext], AsyncIterator[R]]


def _internal(name: str) -> str:
    log.exception("gRPC %s failed", name)
    return "Internal server error"


def unary(method: Unary[R]) -> Unary[R]:
    """An RPC method whose ApiErrors become statuses and whose bugs become INTERNAL (never UNKNOWN)."""

    @functools.wraps(method)
    async def call(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            return await method(self, request, context)
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except ApiError as exc:
            await abort(context, exc)
        except Exception:  # noqa: BLE001 - a bug of ours: INTERNAL, logged, rather than UNKNOWN
            await context.abort(grpc.StatusCode.INTERNAL, _internal(method.__name__))
        raise AssertionError("unreachable: context.abort raises")

    return call


def streaming(method: Streaming[R]) -> Streaming[R]:
    """``unary`` for a server-streaming RPC method (an async generator)."""

    @functools.wraps(method)
    async def call(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[R]:
        try:
            async for item in method(self, request, context):
                yield item
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except ApiError as exc:
            await abort(context, exc)
        except Exception:  # noqa: BLE001
            await context.abort(grpc.StatusCode.INTERNAL, _internal(method.__name__))

    return call


__all__ = ["CODES", "abort", "code_for", "refuse_token", "streaming", "unary"]
