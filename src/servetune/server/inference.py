"""The inference API (TorchServe's port 8080): ping, predictions, API description."""

from __future__ import annotations

import asyncio
import time
import uuid

from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message

from servetune._exceptions import ModelError
from servetune.server.auth import TokenStore, auth_failed
from servetune.server.batcher import Job, QueueFull
from servetune.server.http import NO_CACHE_HEADERS, error_response, exception_handlers, json_response
from servetune.server.model import NoWorker
from servetune.server.openapi import inference_spec
from servetune.server.registry import ModelRegistry

RETRY_AFTER_S = "1"


class BodyTooLarge(Exception):
    pass


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


async def parse_inputs(request: Request, body: bytes) -> list[tuple[str, str | None, bytes]]:
    """TorchServe's rule: form fields become one parameter each; any other body is the parameter ``body``."""
    ctype = request.headers.get("content-type")
    base = (ctype or "").split(";")[0].strip().lower()
    if base not in ("multipart/form-data", "application/x-www-form-urlencoded"):
        return [("body", ctype, body)]

    async def replay() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    form_request = Request(request.scope, replay)
    try:
        form = await form_request.form(max_files=1000, max_fields=1000)
    except Exception as exc:  # python-multipart raises several types for a malformed body
        raise ModelError(f"Malformed {base} body: {exc}", 400, "BadRequestException") from None
    inputs: list[tuple[str, str | None, bytes]] = []
    try:
        for name, value in form.multi_items():
            if isinstance(value, UploadFile):
                inputs.append((name, value.content_type, await value.read()))
            else:
                inputs.append((name, "text/plain", str(value).encode()))
    finally:
        await form.close()
    if not inputs:
        raise ModelError(f"Empty {base} body: no fields", 400, "BadRequestException")
    return inputs


def create_inference_app(registry: ModelRegistry, tokens: TokenStore | None) -> Starlette:
    config = registry.config
    require_token = tokens is not None and config.inference_token_authorization

    def authorized(request: Request) -> bool:
        return not require_token or (
            tokens is not None and tokens.check("inference", request.headers.get("authorization"))
        )

    async def ping(request: Request) -> Response:
        if not config.open_ping and not authorized(request):
            return auth_failed()
        healthy = all(m.healthy() for m in registry.all_models())
        if healthy:
            return json_response({"status": "Healthy"})
        return json_response({"status": "Unhealthy"}, 500)

    async def api_description(request: Request) -> Response:
        return json_response(inference_spec(registry))

    async def predictions(request: Request) -> Response:
        if not authorized(request):
            return auth_failed()
        received = time.perf_counter()
        name = request.path_params["model"]
        version = request.path_params.get("version")
        try:
            model = registry.get(name, version)
        except ModelError as exc:
            return error_response(exc.status, exc.type, exc.message)
        try:
            body = await read_body(request, config.max_request_size)
        except BodyTooLarge:
            registry.metrics.observe_status(413)
            return error_response(
                413,
                "RequestEntityTooLargeException",
                f"Request body is larger than max_request_size ({config.max_request_size} bytes)",
            )
        try:
            inputs = await parse_inputs(request, body)
        except ModelError as exc:
            registry.metrics.observe_status(exc.status)
            return error_response(exc.status, exc.type, exc.message)

        loop = asyncio.get_running_loop()
        request_id = request.headers.get("x-request-id") or str(uuid.uuid4())
        headers = dict(request.headers)
        headers.setdefault("explain", "False")
        disconnected = False

        async def watch_disconnect() -> None:
            nonlocal disconnected
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    disconnected = True
                    return

        job = Job(request_id, headers, inputs, loop.time(), loop.create_future(), lambda: disconnected)
        try:
            model.submit(job)
        except QueueFull:
            registry.metrics.observe_status(503)
            return error_response(
                503,
                "ServiceUnavailableException",
                f'Model "{name}" has a full job queue ({model.batcher.capacity} requests waiting); retry later',
                {"Retry-After": RETRY_AFTER_S},
            )
        except NoWorker as exc:
            registry.metrics.observe_status(503)
            message = str(exc) or (
                f'Model "{name}" has no worker to serve inference request. Please use scale workers API to add workers.'
            )
            return error_response(503, "ServiceUnavailableException", message, {"Retry-After": RETRY_AFTER_S})
        watcher = asyncio.create_task(watch_disconnect())
        try:
            result = await job.future
        except asyncio.CancelledError:
            # The client went away before its batch was sent; nobody is left to answer.
            return Response(b"", 499)
        finally:
            watcher.cancel()
        total_s = time.perf_counter() - received
        registry.metrics.observe_request(
            model.name,
            model.version,
            result.status,
            total_s,
            result.queue_ms / 1000.0,
            result.handler_ms / 1000.0 or None,
        )
        body_out = result.body
        if len(body_out) > config.max_response_size:
            return error_response(
                507,
                "InternalServerException",
                f"Response of {len(body_out)} bytes is larger than max_response_size ({config.max_response_size})",
            )
        out_headers = {
            **NO_CACHE_HEADERS,
            **result.headers,
            "x-request-id": request_id,
            "X-Servetune-Queue-Ms": f"{result.queue_ms:.3f}",
            "X-Servetune-Handler-Ms": f"{result.handler_ms:.3f}",
            "X-Servetune-Batch-Size": str(result.batch_size),
        }
        return Response(body_out, result.status, out_headers, media_type=result.content_type)

    routes = [
        Route("/", api_description, methods=["OPTIONS"]),
        Route("/api-description", api_description, methods=["GET", "OPTIONS"]),
        Route("/ping", ping, methods=["GET", "POST"]),
        Route("/predictions/{model}", predictions, methods=["POST", "PUT"]),
        Route("/predictions/{model}/{version}", predictions, methods=["POST", "PUT"]),
    ]
    return Starlette(routes=routes, exception_handlers=exception_handlers())


__all__ = ["create_inference_app"]
