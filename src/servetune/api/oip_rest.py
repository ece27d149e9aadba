"""The Open Inference Protocol v2 over REST, on the inference port (KServe's ``/v2`` API), for every backend.

``GET /v2/health/live``, ``/v2/health/ready`` (the server's readiness, as ``/ping``: 503 while not ready), ``/v2``
(server metadata), ``/v2/models`` (KServe's list), ``/v2/models/{name}[/versions/{version}]`` (model metadata),
``.../ready`` (503 when not ready), ``POST .../infer`` (and ``.../explain``, as TorchServe routes it; both 503 at
once for a model that is not ready, as KServe answers). Inference
bodies are JSON or the binary tensor data extension (``Inference-Header-Content-Length``); gzip/deflate request
bodies are accepted. Errors: ``{"error": message}`` (``servetune.api.oip``).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from servetune import __version__
from servetune._exceptions import ApiError
from servetune.api.answers import (
    CLIENT_GONE,
    answer_problem,
    new_request_id,
    observe,
    request_headers,
    result_response,
    run_watched,
    while_starting,
)
from servetune.api.body import read_body
from servetune.api.http import json_response, kserve_error_response
from servetune.api.metrics import ApiMetrics
from servetune.api.offload import off_loop
from servetune.api.oip import answer_error, ensure_ready, infer_request, tensor_error
from servetune.api.types import InferenceBackend, InferRequest, InferResult, Readiness
from servetune.config.server import ServerConfig
from servetune.tensors import HEADER_LENGTH, InferenceRequest, TensorError, parse_header_length, parse_request

SERVER_NAME = "servetune"
EXTENSIONS = ("binary_tensor_data",)

Authorize = Callable[[Request, bool], None]


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """A gzip or deflate request body (tritonclient's ``request_compression_algorithm``), within ``limit``."""
    encoding = (encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise ApiError(f"Content-Encoding {encoding!r} is not supported (gzip, deflate)", 415, "BadRequestException")
    inflater = zlib.decompressobj(zlib.MAX_WBITS | (16 if encoding == "gzip" else 0))
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ApiError.bad_request(f"the {encoding} body cannot be decompressed ({exc})") from None
    if len(out) > limit:
        raise ApiError.too_large(limit)
    return out


async def read_inference_request(request: Request, limit: int) -> tuple[bytes, int | None]:
    """The (decompressed) body and the JSON part's length."""
    body = decompress(await read_body(request, limit), request.headers.get("content-encoding"), limit)
    try:
        return body, parse_header_length(request.headers.get(HEADER_LENGTH))
    except TensorError as exc:
        raise ApiError.bad_request(str(exc)) from None


def kserve_answer(result: InferResult, request_id: str, max_response_size: int) -> Response:
    """A worker's answer as KServe v1 / OIP v2 REST sends it: errors as ``{"error": ...}``, an oversize answer 507."""
    if result.status != 200:
        return kserve_error_response(answer_error(result))
    problem = answer_problem(result, max_response_size)
    if problem is not None:
        return kserve_error_response(problem)
    return result_response(result, request_id, max_response_size)


@dataclass(frozen=True)
class RestServed:
    """What the KServe v1 and OIP v2 REST routes answer from; ``authorize(request, probe)`` checks the inference
    token (``probe``: a health or metadata call, open when ``open_ping`` is set)."""

    backend: InferenceBackend
    config: ServerConfig
    metrics: ApiMetrics | None
    readiness: Readiness
    authorize: Authorize

    def parts(self) -> tuple[InferenceBackend, ServerConfig, ApiMetrics | None, Readiness, Authorize]:
        return self.backend, self.config, self.metrics, self.readiness, self.authorize


def failure_answer(readiness: Readiness, metrics: ApiMetrics | None) -> Callable[[ApiError, str | None], Response]:
    """An error as KServe's protocols answer it, counted; a model not loaded yet while the server starts is 503."""

    def failed(error: ApiError, name: str | None = None) -> Response:
        error = while_starting(error, name, readiness)
        if metrics is not None:
            metrics.observe_status(error.status)
        return kserve_error_response(error)

    return failed


MakeJob = Callable[[Request, str, bool], Awaitable[InferRequest]]  # (request, request id, explain) -> the job


def inference_runner(
    served: RestServed, failed: Callable[[ApiError, str | None], Response], make_job: MakeJob
) -> Callable[[Request, str, str | None, bool], Awaitable[Response]]:
    """One KServe v1 / OIP v2 REST inference: the protocol's job from the request, run while the client is there,
    observed, answered in the protocol's shape."""

    backend, config, metrics, _, authorize = served.parts()

    async def run(request: Request, name: str, version: str | None, explain: bool) -> Response:
        authorize(request, False)
        received = time.perf_counter()
        request_id = request.headers.get("x-request-id") or new_request_id()
        try:
            await ensure_ready(backend, name, version)
            job = await make_job(request, request_id, explain)
            result = await run_watched(backend, request, name, version, job)
        except ApiError as exc:
            return failed(exc, name)
        except asyncio.CancelledError:
            return Response(b"", CLIENT_GONE)
        observe(metrics, name, version, result, received)
        return kserve_answer(result, request_id, config.max_response_size)

    return run


def oip_routes(served: RestServed) -> list[BaseRoute]:
    backend, config, metrics, readiness, authorize = served.parts()
    failed = failure_answer(readiness, metrics)

    async def live(request: Request) -> Response:
        authorize(request, True)
        return json_response({"live": True})

    async def server_ready(request: Request) -> Response:
        authorize(request, True)
        ready = not readiness.starting and not readiness.failed and await backend.healthy()
        return json_response({"ready": ready}, 200 if ready else 503)

    async def server_metadata(request: Request) -> Response:
        authorize(request, True)
        return json_response({"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)})

    async def models(request: Request) -> Response:
        authorize(request, True)
        return json_response({"models": sorted({m.name for m in backend.models()})})

    def target(request: Request) -> tuple[str, str | None]:
        return request.path_params["model"], request.path_params.get("version")

    async def model_metadata(request: Request) -> Response:
        authorize(request, True)
        name, version = target(request)
        try:
            return json_response((await backend.metadata(name, version)).to_json())
        except ApiError as exc:
            return failed(exc, name)

    async def model_ready(request: Request) -> Response:
        authorize(request, True)
        name, version = target(request)
        try:
            ready = await backend.ready(name, version)
        except ApiError as exc:
            return failed(exc, name)
        return json_response({"name": name, "ready": ready}, 200 if ready else 503)

    def v2_request(
        body: bytes, header_length: int | None, request_id: str, headers: dict[str, str], explain: bool
    ) -> InferRequest:
        """Parse (within the tensor limits) and re-encode for the worker: on a thread for a large body."""
        try:
            parsed: InferenceRequest = parse_request(body, header_length, config.tensor_limits)
        except TensorError as exc:
            hint = "" if header_length is not None else f" (binary data needs the {HEADER_LENGTH} header)"
            raise tensor_error(exc, hint if "JSON" in str(exc) else "") from None
        return infer_request(parsed, request_id, headers, explain=explain)

    async def v2_job(request: Request, request_id: str, explain: bool) -> InferRequest:
        body, header_length = await read_inference_request(request, config.max_request_size)
        headers = request_headers(request)
        return await off_loop(len(body), v2_request, body, header_length, request_id, headers, explain)

    run = inference_runner(served, failed, v2_job)

    async def infer(request: Request) -> Response:
        return await run(request, *target(request), False)

    async def explain(request: Request) -> Response:
        return await run(request, *target(request), True)

    routes: list[BaseRoute] = [
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", server_ready, methods=["GET"]),
        Route("/v2", server_metadata, methods=["GET"]),
        Route("/v2/models", models, methods=["GET"]),
    ]
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes += [
            Route(prefix, model_metadata, methods=["GET"]),
            Route(f"{prefix}/ready", model_ready, methods=["GET"]),
            Route(f"{prefix}/infer", infer, methods=["POST"]),
            Route(f"{prefix}/explain", explain, methods=["POST"]),
        ]
    return routes


__all__ = [
    "EXTENSIONS",
    "SERVER_NAME",
    "decompress",
    "failure_answer",
    "inference_runner",
    "kserve_answer",
    "oip_routes",
    "RestServed",
    "read_inference_request",
]
