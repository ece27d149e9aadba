"""Errors on gRPC: every :class:`ApiError` becomes a gRPC status, with the REST API's message as its details.

The table is TorchServe's (``GRPCUtils.getGRPCStatusCode``: HTTP status -> gRPC code), which agrees with KServe's
mapping for the Open Inference Protocol (400 -> INVALID_ARGUMENT, 404 -> NOT_FOUND, 503 -> UNAVAILABLE, 501 ->
UNIMPLEMENTED). Two additions, so that a caller's error never reads as the server's: 507 (an answer larger than
``max_response_size``) -> RESOURCE_EXHAUSTED, and an unknown model or version is NOT_FOUND on every RPC (TorchServe
answers INTERNAL for it on Predictions). Only a failure of servetune itself is INTERNAL, never UNKNOWN.
"""

from __future__ import annotations

import grpc

from servetune._exceptions import ApiError

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
    """End the call with the error's code and message (raises, as ``context.abort`` does). A missing, wrong or expired
    ``authorization: Bearer`` key is UNAUTHENTICATED with the REST API's message (TorchServe answers
    PERMISSION_DENIED with the same message)."""
    code = grpc.StatusCode.UNAUTHENTICATED if error.type == "InvalidKeyException" else code_for(error.status)
    await context.abort(code, error.message)


__all__ = ["CODES", "abort", "code_for"]
