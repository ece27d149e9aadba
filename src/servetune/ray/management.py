"""TorchServe's management API for the Ray backend, served by the driver: list, describe, scale, register,
unregister.

``PUT /models/{name}[/{version}]?min_worker=N[&max_worker=M][&synchronous=true]`` sets the deployment's
``num_replicas`` (an autoscaling range when M > N; 0 removes the deployment and requests get 503); servetune's
extension ``?batch_size=B&max_batch_delay=D`` (either or both, with or without the workers) sets the batch size and
delay of the live replicas through ``user_config`` (no restart; without ``min_worker``/``max_worker`` the replicas
are not scaled), and describe shows them at once;
``GET /models/{name}`` describes the version with its live replica processes as ``workers``. ``POST /models`` and
``DELETE /models/{name}[/{version}]`` (only with ``enable_model_api``) add or remove an application or deployment.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from servetune._exceptions import ConfigError, ModelError
from servetune.config.server import ServerConfig
from servetune.ray.controller import RayBackend
from servetune.ray.plan import VersionPlan, plan_version
from servetune.server import sources
from servetune.server.auth import TokenStore, auth_failed
from servetune.server.http import METHOD_NOT_ALLOWED_MESSAGE, error_response, exception_handlers, json_response
from servetune.server.management import (
    batching_params,
    bool_param,
    int_param,
    page_of_models,
    request_params,
    scale_params,
)

SCALE_TIMEOUT_S = 120.0


async def _register(backend: RayBackend, config: ServerConfig, params: dict[str, str]) -> tuple[int, str]:
    if "url" not in params:
        raise ModelError("Parameter url is required.", 400)
    path = await sources.resolve(params["url"], config.model_store, config.allowed_urls)
    try:
        plan = await asyncio.to_thread(
            plan_version, config, path, params.get("model_name") or None, loaded_at_startup=False
        )
    except ConfigError as exc:
        raise ModelError(str(exc), 400, "BadRequestException") from None
    for key, minimum in (("batch_size", 1), ("max_batch_delay", 0), ("initial_workers", 0), ("response_timeout", 1)):
        value = int_param(params, key)
        if value is not None and not minimum <= value <= 1_000_000:
            raise ModelError(f"{key} must be between {minimum} and 1000000, got {value}", 400)
    plan = plan.with_api_params(
        batch_size=int_param(params, "batch_size"),
        max_batch_delay=int_param(params, "max_batch_delay"),
        workers=int_param(params, "initial_workers"),
        response_timeout=int_param(params, "response_timeout"),
        handler=params.get("handler") or None,
    )
    name, version, workers = plan.spec.model_name, plan.spec.version, plan.min_workers
    await asyncio.to_thread(backend.register, plan)
    if workers == 0:
        return 200, (
            f'Model "{name}" Version: {version} registered with 0 initial workers. '
            "Use scale workers API to add workers for the model."
        )
    if not bool_param(params, "synchronous", True):
        return 202, "Processing worker updates..."
    timeout = float(config.default_startup_timeout) + 60.0
    failure = (await asyncio.to_thread(backend.wait_deployed, timeout, [name])).get(name)
    if failure is not None:
        await asyncio.to_thread(backend.unregister, name, version)
        message = f"Failed to start workers for model {name} version {version}: {failure}"
        raise ModelError(message, 500, "InternalServerException")
    return 200, f'Model "{name}" Version: {version} registered with {workers} initial workers'


def _names_workers(params: dict[str, str]) -> bool:
    return "min_worker" in params or "max_worker" in params


async def _update(
    backend: RayBackend, config: ServerConfig, name: str, path_version: str | None, params: dict[str, str]
) -> tuple[int, str]:
    """``PUT /models/{name}[/{version}]``: scale and/or re-batch in one config change (everything validated first)."""
    version = path_version or params.get("model_version")
    plan = backend.get(name, version)
    batch_size, max_batch_delay = batching_params(params) or (None, None)
    rebatch = batch_size is not None or max_batch_delay is not None
    workers = scale_params(params, config) if not rebatch or _names_workers(params) else None
    if rebatch:
        plan = plan.rebatched_to(batch_size, max_batch_delay)
    if workers is not None:
        plan = plan.scaled(*workers)
    await asyncio.to_thread(backend.update, plan)
    synchronous = bool_param(params, "synchronous", False)
    if workers is not None and not synchronous:
        return 202, "Processing worker updates..."
    if synchronous:
        timeout = float(int_param(params, "timeout") or SCALE_TIMEOUT_S)
        count = workers[0] if workers is not None else (None if plan.autoscaling else plan.min_workers)
        if not await asyncio.to_thread(backend.wait_replicas, name, plan.spec.version, count, timeout):
            return 206, "Workers scaling in progress..."
    suffix = "" if path_version is None else f", version: {version}"
    parts = [
        f"Batching set to batch_size={plan.batch_size}, max_batch_delay={plan.max_batch_delay_ms} for model: {name}"
    ]
    parts = parts if rebatch else []
    if workers is not None:
        parts.append(f"Workers scaled to {workers[0]} for model: {name}{suffix}")
    return 200, "; ".join(parts)


def describe(backend: RayBackend, plan: VersionPlan) -> dict[str, Any]:
    spec = plan.spec
    name, version = spec.model_name, spec.version
    replicas = backend.replicas(name, version)
    status = backend.deployment_status(name, version)
    model = backend.models[name]
    return {
        "modelName": name,
        "modelVersion": version,
        "modelUrl": plan.model_url,
        "runtime": plan.manifest.get("runtime", "python"),
        "minWorkers": plan.min_workers,
        "maxWorkers": plan.max_workers,
        "batchSize": plan.batch_size,
        "maxBatchDelay": plan.max_batch_delay_ms,
        "responseTimeout": int(spec.response_timeout_s),
        "deviceType": "gpu" if spec.gpu else "cpu",
        "isDefault": model.default_version == version,
        "backend": "ray",
        "deployment": status,
        "workers": [
            {
                "id": r.actor_id[:12],
                "startTime": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(r.start_time)),
                "status": "READY" if r.state == "ALIVE" else r.state,
                "pid": r.pid,
                "memoryUsage": r.memory_bytes,
                "node": r.node_id,
                "gpu": spec.gpu,
            }
            for r in replicas
        ],
    }


def create_management_app(backend: RayBackend, config: ServerConfig, tokens: TokenStore | None) -> Starlette:
    def authorized(request: Request) -> bool:
        return tokens is None or tokens.check("management", request.headers.get("authorization"))

    def not_allowed() -> Response:
        return error_response(405, "MethodNotAllowedException", METHOD_NOT_ALLOWED_MESSAGE)

    async def models(request: Request) -> Response:
        if not authorized(request):
            return auth_failed()
        if request.method != "GET":
            if not config.enable_model_api:
                return not_allowed()
            status, message = await _register(backend, config, await request_params(request))
            return json_response({"status": message}, status)
        params = dict(request.query_params)
        return json_response(page_of_models(params, sorted(backend.models), lambda n: backend.get(n).model_url))

    async def model(request: Request) -> Response:
        if not authorized(request):
            return auth_failed()
        name = request.path_params["name"]
        version = request.path_params.get("version")
        if request.method == "GET":
            if version == "all":
                backend.get(name)
                plans = [backend.models[name].versions[v] for v in sorted(backend.models[name].versions)]
            else:
                plans = [backend.get(name, version)]
            described = await asyncio.to_thread(lambda: [describe(backend, p) for p in plans])
            return json_response(described)
        if request.method == "DELETE":
            if not config.enable_model_api:
                return not_allowed()
            await asyncio.to_thread(backend.unregister, name, version)
            return json_response({"status": f'Model "{name}" unregistered'})
        params = dict(request.query_params)
        status, message = await _update(backend, config, name, version, params)
        return json_response({"status": message}, status)

    routes = [
        Route("/models", models, methods=["GET", "POST"]),
        Route("/models/{name}", model, methods=["GET", "PUT", "DELETE"]),
        Route("/models/{name}/{version}", model, methods=["GET", "PUT", "DELETE"]),
    ]
    return Starlette(routes=routes, exception_handlers=exception_handlers())


__all__ = ["create_management_app", "describe"]
