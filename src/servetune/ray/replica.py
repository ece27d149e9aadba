"""A Ray Serve replica of one model version: it loads the archive as a native worker does and answers TorchServe's
``/predictions/{model}[/{version}]`` itself (the proxy hands it the HTTP request: one hop).

Load: ``open_archive`` into a private directory, then ``load_service`` with the same arguments as
``servetune.server.worker`` (context, batch size, model-config with its ``optimization`` variant, GPU 0 of the
replica's own GPU when ``deviceType: gpu``). Batches: ``@serve.batch`` with max size = ``batchSize`` and wait =
``maxBatchDelay``, both from ``user_config`` (changed in place); one batch at a time, run on a thread so that the
next batch forms meanwhile.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from ray import serve
from ray.exceptions import RayActorError
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from servetune._exceptions import ModelError
from servetune.handlers.codec import error_body
from servetune.handlers.service import InputParam, Request, Service, load_service
from servetune.ray.plan import ReplicaSpec, no_worker_message
from servetune.server.http import METHOD_NOT_ALLOWED_MESSAGE, NO_CACHE_HEADERS, NOT_FOUND_MESSAGE, error_response
from servetune.server.inference import BodyTooLarge, parse_inputs, read_body

# (request id, headers, inputs as (name, content type, bytes)) -> one result dict per request
Item = tuple[str, dict[str, str], list[tuple[str, str | None, bytes]]]
DEFAULT_DELAY_S = 0.1


def load(spec: ReplicaSpec, workdir: Path) -> Service:
    """Open the archive and load its handler the way a native worker does."""
    import torch

    from servetune.archive import open_archive

    torch.set_num_threads(max(1, spec.num_threads))
    archive = open_archive(Path(spec.url), workdir / "model")
    manifest: dict[str, Any] = dict(archive.manifest.raw)
    if spec.handler:
        manifest["model"] = {**(manifest.get("model") or {}), "handler": spec.handler}
    return load_service(
        model_dir=archive.model_dir,
        manifest=manifest,
        model_name=spec.model_name,
        gpu_id=0 if spec.gpu else None,  # Ray sets CUDA_VISIBLE_DEVICES to the replica's one GPU
        batch_size=spec.batch_size,
        model_yaml_config=spec.model_yaml_config,
        limit_max_image_pixels=spec.limit_max_image_pixels,
        decode_input_request=spec.decode_input_request,
    )


class ModelReplica:
    """Deployment class of a model version. ``others`` are handles to the model's other versions' deployments;
    ``idle`` names its versions scaled to 0 workers."""

    def __init__(
        self, spec: dict[str, Any], others: dict[str, Any] | None = None, idle: list[str] | None = None
    ) -> None:
        self.spec = ReplicaSpec.from_dict(spec)
        self.others = others or {}
        self.idle = set(idle or ())
        self.stuck: str | None = None
        workdir = Path(tempfile.mkdtemp(prefix="servetune-replica-"))
        atexit.register(shutil.rmtree, workdir, True)
        self.service = load(self.spec, workdir)
        self.batched.set_max_batch_size(self.spec.batch_size)  # type: ignore[attr-defined]

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """``user_config`` changes apply in place, from the next batch on: the batch size (the batch queue's and the
        handler's ``context.system_properties["batch_size"]``) and the batch delay. Ray calls this after
        ``__init__`` and on every ``user_config`` change, without restarting the replica."""
        batch_size = int(user_config.get("batch_size", self.spec.batch_size))
        delay_ms = float(user_config.get("max_batch_delay_ms", DEFAULT_DELAY_S * 1000.0))
        self.batched.set_max_batch_size(batch_size)  # type: ignore[attr-defined]
        self.batched.set_batch_wait_timeout_s(delay_ms / 1000.0)  # type: ignore[attr-defined]
        self.service.context.system_properties["batch_size"] = batch_size

    def check_health(self) -> None:
        """A replica whose handler overran ``responseTimeout`` is replaced, as a native worker is killed."""
        if self.stuck is not None:
            raise RuntimeError(self.stuck)

    async def infer(self, item: Item) -> dict[str, Any]:
        """One request through this version's batch queue (also called by the default version's ingress)."""
        result: dict[str, Any] = await self.batched((time.perf_counter(), item))
        return result

    @serve.batch(max_batch_size=1, batch_wait_timeout_s=DEFAULT_DELAY_S)
    async def batched(self, entries: list[tuple[float, Item]]) -> list[dict[str, Any]]:
        started = time.perf_counter()
        if self.stuck is not None:  # a timed-out batch may still hold the handler: wait for the replacement
            return [_error_result(503, "ServiceUnavailableException", self.stuck) for _ in entries]
        requests = [
            Request(
                request_id=rid,
                headers=headers,
                inputs=[InputParam(name=n, content_type=c, data=d) for n, c, d in inputs],
            )
            for _, (rid, headers, inputs) in entries
        ]
        timeout = self.spec.response_timeout_s
        try:
            responses = await asyncio.wait_for(asyncio.to_thread(self.service.predict, requests), timeout)
        except TimeoutError:
            self.stuck = f"worker {os.getpid()} took longer than {timeout:g} s; it is being replaced"
            return [_error_result(504, "RequestTimeoutException", self.stuck) for _ in entries]
        handler_ms = (time.perf_counter() - started) * 1000.0
        return [
            {
                "status": r.status,
                "body": r.body,
                "content_type": r.content_type,
                "headers": r.headers,
                "queue_ms": (started - arrival) * 1000.0,
                "handler_ms": handler_ms,
                "batch_size": len(entries),
                "pid": os.getpid(),
            }
            for (arrival, _), r in zip(entries, responses, strict=True)
        ]

    async def __call__(self, request: HTTPRequest) -> Response:
        """TorchServe's ``POST|PUT /predictions/{model}[/{version}]``."""
        routable, version = _version_from_path(request.scope, self.spec.model_name)
        if not routable:
            return error_response(404, "ResourceNotFoundException", NOT_FOUND_MESSAGE)
        if request.method not in ("POST", "PUT"):
            return error_response(405, "MethodNotAllowedException", METHOD_NOT_ALLOWED_MESSAGE)
        target = None
        if version is not None and version != self.spec.version:
            target = self.others.get(version)
            if version in self.idle:
                message = no_worker_message(self.spec.model_name)
                return error_response(503, "ServiceUnavailableException", message, {"Retry-After": "1"})
            if target is None:
                message = f"Model version: {version} does not exist for model: {self.spec.model_name}"
                return error_response(404, "ModelVersionNotFoundException", message)
        try:
            body = await read_body(request, self.spec.max_request_size)
        except BodyTooLarge:
            message = f"Request body is larger than max_request_size ({self.spec.max_request_size} bytes)"
            return error_response(413, "RequestEntityTooLargeException", message)
        try:
            inputs = await parse_inputs(request, body)
        except ModelError as exc:
            return error_response(exc.status, exc.type, exc.message)
        request_id = request.headers.get("x-request-id") or str(uuid.uuid4())
        headers = dict(request.headers)
        headers.setdefault("explain", "False")
        item: Item = (request_id, headers, inputs)
        if target is None:
            return _http_response(await self.infer(item), self.spec.max_response_size)
        try:
            result = await target.infer.remote(item)
        except RayActorError as exc:  # the other version's replica died mid-request
            message = f"Worker died while running this request: {exc}"
            return error_response(503, "ServiceUnavailableException", message)
        return _http_response(result, self.spec.max_response_size)


def _version_from_path(scope: MutableMapping[str, Any], model: str) -> tuple[bool, str | None]:
    """(routable, version) for ``/predictions/<model>[/<version>]``; anything deeper is not a route."""
    prefix = f"/predictions/{model}"
    path: str = scope["path"]
    if not path.startswith(prefix):  # an ASGI server that strips the route prefix into root_path
        path = str(scope.get("root_path", "")) + path
    if not path.startswith(prefix):
        return False, None
    rest = path[len(prefix) :].strip("/")
    if "/" in rest:
        return False, None
    return True, rest or None


def _error_result(status: int, type_: str, message: str) -> dict[str, Any]:
    return {
        "status": status,
        "body": error_body(status, type_, message),
        "content_type": "application/json",
        "headers": {},
        "queue_ms": 0.0,
        "handler_ms": 0.0,
        "batch_size": 1,
    }


def _http_response(result: dict[str, Any], max_response_size: int) -> Response:
    body: bytes = result["body"]
    if len(body) > max_response_size:
        message = f"Response of {len(body)} bytes is larger than max_response_size ({max_response_size})"
        return error_response(507, "InternalServerException", message)
    headers = {  # Ray's proxy adds x-request-id (the id the handler saw)
        **NO_CACHE_HEADERS,
        **result["headers"],
        "X-Servetune-Queue-Ms": f"{result['queue_ms']:.3f}",
        "X-Servetune-Handler-Ms": f"{result['handler_ms']:.3f}",
        "X-Servetune-Batch-Size": str(result["batch_size"]),
    }
    return Response(body, int(result["status"]), headers, media_type=result["content_type"])


__all__ = ["ModelReplica", "load"]
