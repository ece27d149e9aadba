"""The management API (TorchServe's port 8081): register, list, describe, scale, unregister, set-default."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from servetune._exceptions import ModelError
from servetune.config.server import ServerConfig
from servetune.server.auth import TokenStore, auth_failed
from servetune.server.batcher import Job, QueueFull
from servetune.server.http import METHOD_NOT_ALLOWED_MESSAGE, error_response, exception_handlers, json_response
from servetune.server.model import NoWorker, ServedModel
from servetune.server.openapi import management_spec
from servetune.server.registry import ModelRegistry, RegisterParams


async def request_params(request: Request) -> dict[str, str]:
    """Query parameters, or the same names in a JSON body (TorchServe accepts both)."""
    params = dict(request.query_params)
    if (request.headers.get("content-type") or "").startswith("application/json"):
        raw = await request.body()
        if raw.strip():
            try:
                body = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ModelError(f"Invalid JSON body: {exc.msg}", 400) from None
            if not isinstance(body, dict):
                raise ModelError("JSON body must be an object", 400)
            params.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in body.items()})
    return params


def int_param(params: dict[str, str], key: str) -> int | None:
    """TorchServe ignores a non-integer numeric parameter and uses the default."""
    try:
        return int(params[key]) if key in params else None
    except ValueError:
        return None


def bool_param(params: dict[str, str], key: str, default: bool) -> bool:
    value = params.get(key)
    return default if value is None else value.strip().lower() == "true"


def page_of_models(params: dict[str, str], names: list[str], url_of: Callable[[str], str]) -> dict[str, Any]:
    """``GET /models`` paging, TorchServe's: ``limit`` (default and max 100), ``next_page_token`` (an offset)."""
    limit = int_param(params, "limit") or 100
    limit = 100 if limit <= 0 or limit > 100 else limit
    start = max(0, int_param(params, "next_page_token") or 0)
    payload: dict[str, Any] = {}
    if start + limit < len(names):
        payload["nextPageToken"] = str(start + limit)
    payload["models"] = [{"modelName": n, "modelUrl": url_of(n)} for n in names[start : start + limit]]
    return payload


def scale_params(params: dict[str, str], config: ServerConfig) -> tuple[int, int]:
    """``min_worker`` (default 1) and ``max_worker`` (default min) of a scale request, validated."""
    min_worker = int_param(params, "min_worker")
    min_worker = 1 if min_worker is None else min_worker
    max_worker = int_param(params, "max_worker")
    max_worker = min_worker if max_worker is None else max_worker
    if min_worker < 0:
        raise ModelError("min_worker cannot be negative.", 400)
    if max(min_worker, max_worker) > config.max_workers_per_model:
        raise ModelError(f"Workers are limited to max_workers_per_model={config.max_workers_per_model} per model.", 400)
    if max_worker < min_worker:
        raise ModelError("max_worker cannot be less than min_worker.", 400)
    return min_worker, max_worker


def batching_params(params: dict[str, str]) -> tuple[int | None, int | None] | None:
    """``batch_size`` / ``max_batch_delay`` of a PUT (servetune's extension: TorchServe changes them only by
    registering again), validated strictly; None when neither is given."""
    found: list[int | None] = []
    for key, minimum in (("batch_size", 1), ("max_batch_delay", 0)):
        raw = params.get(key)
        if raw is None:
            found.append(None)
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ModelError(f"{key} must be an integer, got {raw!r}", 400) from None
        if not minimum <= value <= 1_000_000:
            raise ModelError(f"{key} must be between {minimum} and 1000000, got {value}", 400)
        found.append(value)
    if found == [None, None]:
        return None
    return found[0], found[1]


def describe(model: ServedModel, registry: ModelRegistry) -> dict[str, Any]:
    config = model.config
    return {
        "modelName": model.name,
        "modelVersion": model.version,
        "modelUrl": model.spec.url,
        "runtime": model.spec.manifest.get("runtime", "python"),
        "minWorkers": model.min_workers,
        "maxWorkers": model.max_workers,
        "batchSize": model.batcher.batch_size,
        "maxBatchDelay": int(model.batcher.max_delay_s * 1000),
        "responseTimeout": int(model.response_timeout_s),
        "startupTimeout": int(model.startup_timeout_s),
        "deviceType": config.device_type or ("gpu" if registry.gpus else "cpu"),
        "deviceIds": list(config.device_ids),
        "loadedAtStartup": model.spec.loaded_at_startup,
        "isDefault": registry.defaults.get(model.name) == model.version,
        "health": {"healthy": model.healthy(), "crashLoop": model.crash_loop},
        "workers": model.describe_workers(),
        "jobQueueStatus": {
            "remainingCapacity": model.batcher.remaining_capacity,
            "pendingRequests": len(model.batcher),
        },
    }


async def customized_metadata(model: ServedModel) -> Any:
    """Ask the handler (``describe_handle``) through a describe job, as TorchServe does."""
    loop = asyncio.get_running_loop()
    job = Job(
        str(uuid.uuid4()),
        {"describe": "True"},
        [("body", None, b"")],
        loop.time(),
        loop.create_future(),
        extra={"solo": True},
    )
    try:
        model.submit(job)
    except (NoWorker, QueueFull):
        raise ModelError(
            f"Model {model.name} has no worker available to describe it", 503, "ServiceUnavailableException"
        ) from None
    result = await job.future
    if result.status != 200:
        raise ModelError(
            f"Describe failed for model {model.name}: {result.body.decode(errors='replace')}",
            result.status,
            "InternalServerException",
        )
    try:
        return json.loads(result.body)
    except json.JSONDecodeError:
        return result.body.decode(errors="replace")


def create_management_app(registry: ModelRegistry, tokens: TokenStore | None) -> Starlette:
    config = registry.config

    def authorized(request: Request) -> bool:
        return tokens is None or tokens.check("management", request.headers.get("authorization"))

    def model_api_disabled() -> Response:
        return error_response(405, "MethodNotAllowedException", METHOD_NOT_ALLOWED_MESSAGE)

    async def models(request: Request) -> Response:
        if not authorized(request):
            return auth_failed()
        if request.method == "GET":
            return list_models(request)
        if not config.enable_model_api:
            return model_api_disabled()
        params = await request_params(request)
        if "url" not in params:
            raise ModelError("Parameter url is required.", 400)
        register = RegisterParams(
            url=params["url"],
            model_name=params.get("model_name") or None,
            handler=params.get("handler") or None,
            batch_size=int_param(params, "batch_size"),
            max_batch_delay=int_param(params, "max_batch_delay"),
            initial_workers=int_param(params, "initial_workers"),
            response_timeout=int_param(params, "response_timeout"),
            startup_timeout=int_param(params, "startup_timeout"),
            synchronous=bool_param(params, "synchronous", True),
        )
        for key, minimum in (
            ("batch_size", 1),
            ("max_batch_delay", 0),
            ("initial_workers", 0),
            ("response_timeout", 1),
            ("startup_timeout", 1),
        ):
            value = getattr(register, key)
            if value is not None and not minimum <= value <= 1_000_000:
                raise ModelError(f"{key} must be between {minimum} and 1000000, got {value}", 400)
        if (register.initial_workers or 0) > config.max_workers_per_model:
            raise ModelError(
                f"Workers are limited to max_workers_per_model={config.max_workers_per_model} per model.", 400
            )
        status, message = await registry.register(register)
        return json_response({"status": message}, status)

    def list_models(request: Request) -> Response:
        params = dict(request.query_params)
        return json_response(page_of_models(params, sorted(registry.models), lambda n: registry.get(n).spec.url))

    async def model(request: Request) -> Response:
        if not authorized(request):
            return auth_failed()
        name = request.path_params["name"]
        version = request.path_params.get("version")
        if request.method == "GET":
            if version == "all":
                found = [registry.get(name, v) for v in sorted(registry.models.get(name, {}))] or [registry.get(name)]
            else:
                found = [registry.get(name, version)]
            described = [describe(m, registry) for m in found]
            if request.query_params.get("customized", "").lower() == "true":
                for entry, served in zip(described, found, strict=True):
                    entry["customizedMetadata"] = await customized_metadata(served)
            return json_response(described)
        if request.method == "DELETE":
            if not config.enable_model_api:
                return model_api_disabled()
            return json_response({"status": await registry.unregister(name, version)})
        # PUT: scale workers, and (servetune's extension) change batching in place
        params = dict(request.query_params)
        version = version or params.get("model_version")
        served = registry.get(name, version)
        batching = batching_params(params)
        scaling = batching is None or "min_worker" in params or "max_worker" in params
        min_worker, max_worker = scale_params(params, config)  # validated before anything changes
        if batching is not None:
            served.rebatch(*batching)
            message = f"Batching set to batch_size={served.config.batch_size}, max_batch_delay=" + (
                f"{served.config.max_batch_delay_ms} for model: {name}"
            )
            if not scaling:
                return json_response({"status": message})
        status, scaled = await registry.scale(
            name, version, min_worker, max_worker, bool_param(params, "synchronous", False)
        )
        return json_response({"status": scaled if batching is None else f"{message}; {scaled}"}, status)

    async def set_default(request: Request) -> Response:
        if not authorized(request):
            return auth_failed()
        message = registry.set_default(request.path_params["name"], request.path_params["version"])
        return json_response({"status": message})

    async def token(request: Request) -> Response:
        if tokens is None:
            raise ModelError("Token authorization is disabled", 400, "BadRequestException")
        if not tokens.check("API", request.headers.get("authorization")):
            return auth_failed()
        kind = request.query_params.get("type", "")
        if kind not in ("management", "inference"):
            raise ModelError(f"type must be management or inference, got {kind!r}", 400)
        return json_response({kind: {"key": tokens.regenerate(kind)}})

    async def api_description(request: Request) -> Response:
        return json_response(management_spec())

    routes = [
        Route("/", api_description, methods=["OPTIONS"]),
        Route("/api-description", api_description, methods=["GET", "OPTIONS"]),
        Route("/models", models, methods=["GET", "POST"]),
        Route("/models/{name}", model, methods=["GET", "PUT", "DELETE"]),
        Route("/models/{name}/{version}", model, methods=["GET", "PUT", "DELETE"]),
        Route("/models/{name}/{version}/set-default", set_default, methods=["PUT"]),
        Route("/token", token, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers=exception_handlers())
