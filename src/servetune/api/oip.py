"""The Open Inference Protocol (KServe v2) over any transport: an OIP request becomes the gateway's :class:`Call` (one
item of the model's dynamic batch, as a TorchServe request is), the worker's answer becomes an OIP response or error.

REST (``servetune.api.oip_rest``) and gRPC both use these: parse the transport's request into a
:class:`~servetune.tensors.InferenceRequest`, :func:`oip_call` -> the gateway -> :func:`infer_response` (or send the
worker's REST body as it is). To the worker the request is the binary extension's body with every input
in binary (its typed control's protocol ``oip-v2``, ``Inference-Header-Content-Length``); the worker's envelope
(``servetune.handlers.envelopes``) answers the REST body the request asks for (``binary_data_output`` in the request
parameters: every output in binary, what gRPC wants for ``raw_output_contents``).

Errors: ``{"error": message}`` with KServe's statuses: 400 invalid input, 404 unknown model or version, 503 not ready
(no worker, a full queue; ``Retry-After``), 500 an inference error (the handler failed), 501 not implemented (an
explain the handler lacks), 413 a body over ``max_request_size``, 504 a handler over its ``responseTimeout``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import replace

from servetune._exceptions import ApiError
from servetune.api.gateway import Call
from servetune.api.types import InferResult, Input
from servetune.handlers.control import OIP_V2, Control
from servetune.tensors import (
    HEADER_LENGTH,
    InferenceRequest,
    InferenceResponse,
    TensorError,
    TensorLimitError,
    encode_request,
    parse_header_length,
    parse_response,
)

KEEP_STATUS_TYPES = ("ServiceUnavailableException", "RequestTimeoutException")  # the server's state, not the handler's
_DROPPED_HEADERS = ("content-type", "content-length", "content-encoding", HEADER_LENGTH.lower())
# a request's control, built once per kind: [explain] -> predict (False) or explain (True)
_CONTROLS = (Control(OIP_V2), Control(OIP_V2, explain=True))


def oip_call(
    request: InferenceRequest,
    model: str,
    version: str | None,
    headers: Mapping[str, str],
    *,
    all_binary: bool = False,
    explain: bool = False,
) -> Call:
    """The gateway's call for ``request`` (``headers``: the transport's, passed to the handler), refused at once when
    the model is not ready (KServe's rule). ``all_binary``: answer every output in binary (gRPC)."""
    if all_binary:
        request = replace(request, parameters={**request.parameters, "binary_data_output": True})
    body, header_length = encode_request(request, binary=True)
    sent = {k: v for k, v in headers.items() if k.lower() not in _DROPPED_HEADERS}
    sent[HEADER_LENGTH.lower()] = str(header_length if header_length is not None else len(body))
    inputs = [Input("body", "application/octet-stream", body)]
    return Call(
        model, version, inputs, _CONTROLS[explain], sent, refuse_not_ready=True, deadline=timeout_deadline(request)
    )


def timeout_deadline(request: InferenceRequest) -> float | None:
    """The request's ``timeout`` parameter (microseconds, as Triton reads it) as a deadline; ApiError 400 for one
    that is not a positive number."""
    timeout = request.parameters.get("timeout")
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 1e15:
        raise ApiError.bad_request(f"parameters.timeout must be a number of microseconds > 0, got {timeout!r:.24}")
    return time.monotonic() + timeout / 1e6


def tensor_error(exc: TensorError, hint: str = "") -> ApiError:
    """A request's tensor error as the protocol's: 413 over a limit (gRPC RESOURCE_EXHAUSTED), else 400."""
    if isinstance(exc, TensorLimitError):
        return ApiError(str(exc), 413, "RequestEntityTooLargeException")
    return ApiError.bad_request(f"{exc}{hint}")


def answer_error(result: InferResult) -> ApiError:
    """A worker's error answer (TorchServe's ``{"code", "type", "message"}``) as the protocol's error: the handler's
    4xx and 501 kept, the server's 503/504 kept, any other failure a 500 inference error."""
    try:
        answer = json.loads(result.body)
        message, kind = str(answer["message"]), str(answer.get("type", ""))
    except (ValueError, KeyError, TypeError):
        message, kind = result.body.decode("utf-8", "replace")[:500] or "Prediction failed", ""
    status = result.status
    if status >= 500 and status != 501 and kind not in KEEP_STATUS_TYPES:
        status = 500
    return ApiError(message, status, kind or "InternalServerException", dict(result.headers))


def infer_response(result: InferResult) -> InferenceResponse:
    """The OIP response in a worker's answer; raises ApiError for an error answer."""
    if result.status != 200:
        raise answer_error(result)
    try:
        return parse_response(result.body, parse_header_length(result.headers.get(HEADER_LENGTH)))
    except TensorError as exc:
        raise ApiError.internal(f"the worker's answer is not an OIP response: {exc}") from None


__all__ = ["KEEP_STATUS_TYPES", "answer_error", "infer_response", "oip_call", "tensor_error"]
