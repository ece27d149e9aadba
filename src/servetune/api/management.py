"""TorchServe's management API (port 8081) over a :class:`~servetune.api.types.Backend`: register, list, describe,
scale, unregister, set-default, tokens; and servetune's in-place changes (``PUT ?batch_size=&num_threads=...``).

Register follows TorchServe's steps (``ApiUtils.handleRegister``): plan the version from its archive, add it with
0 workers, then scale it. Whatever fails after the version was added (a worker that cannot start, a placement that
refuses, a bug) unregisters it before the error goes out: a failed registration leaves nothing registered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Coroutine, Mapping
from dataclasses import replace
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from servetune._exceptions import ApiError, WorkerError
from servetune.api import params as p
from servetune.api import sources
from servetune.api.describe import describe
from servetune.api.gateway import MANAGEMENT, OPEN, TOKEN_API, Caller, Gateway
from servetune.api.openapi import management_spec
from servetune.api.plan import RegisterParams, VersionPlan
from servetune.api.rest import exception_handlers, json_response, route
from servetune.api.types import Backend, InferRequest, Input, ModelRef, Reconfigure
from servetune.config.server import ServerConfig
from servetune.handlers.control import Control

log = logging.getLogger("servetune.api")

SCALE_WAIT_S = 120.0  # a synchronous scale on a backend that cannot track its workers waits this long, then 206


class Management:
    """The operations behind the routes, usable without HTTP (start-up models are registered through here)."""

    def __init__(self, backend: Backend, config: ServerConfig) -> None:
        self.backend = backend
        self.config = config
        self._background: set[asyncio.Task[Any]] = set()

    # ---- lookup ------------------------------------------------------------------------------

    def versions(self, name: str, version: str | None) -> list[ModelRef]:
        """The versions a path names (``all``: every one); ApiError 404 for an unknown model or version."""
        refs = [m for m in self.backend.models() if m.name == name]
        if not refs:
            raise ApiError.model_not_found(name)
        if version == "all":
            return refs
        if version is None:
            return [r for r in refs if r.is_default][:1] or refs[:1]
        found = [r for r in refs if r.version == version]
        if not found:
            raise ApiError.version_not_found(name, version)
        return found

    def list_models(self, params: Mapping[str, str]) -> dict[str, Any]:
        """``GET /models``: the default versions, paged (``limit``, ``next_page_token`` as TorchServe reads them)."""
        names = sorted({m.name: m for m in self.backend.models() if m.is_default}.items())
        start, limit = p.page(params, len(names))
        payload: dict[str, Any] = {}
        if start + limit < len(names):
            payload["nextPageToken"] = str(start + limit)
        payload["models"] = [{"modelName": n, "modelUrl": ref.url} for n, ref in names[start : start + limit]]
        return payload

    async def describe(self, name: str, version: str | None, customized: bool) -> list[dict[str, Any]]:
        """``GET /models/{name}[/{version}|/all][?customized=true]``: TorchServe's describe JSON, one per version."""
        refs = self.versions(name, version)
        described = [describe(await self.backend.status(name, r.version)) for r in refs]
        if customized:
            for entry, ref in zip(described, refs, strict=True):
                entry["customizedMetadata"] = await self.customized_metadata(name, ref.version)
        return described

    async def set_default(self, name: str, version: str) -> str:
        self.versions(name, version)
        await self.backend.set_default(name, version)
        return f'Default version successfully updated for model "{name}" to "{version}"'

    # ---- register / scale / unregister -------------------------------------------------------

    async def register(self, params: RegisterParams) -> tuple[int, str]:
        path = await sources.resolve(params.url, self.config.model_store, self.config.allowed_urls)
        plan = await self.backend.plan(str(path), params)
        await self.backend.add(plan)
        name, version, workers = plan.name, plan.version, plan.min_workers
        if workers == 0:
            return 200, (
                f'Model "{name}" Version: {version} registered with 0 initial workers. '
                "Use scale workers API to add workers for the model."
            )
        if not params.synchronous:
            self.spawn(self._start_or_remove(plan))
            return 202, "Processing worker updates..."
        await self._start_or_remove(plan)
        return 200, f'Model "{name}" Version: {version} registered with {workers} initial workers'

    async def _start_or_remove(self, plan: VersionPlan) -> None:
        """Scale the new version to its workers; on any failure remove it, then raise the ApiError to answer."""
        error: ApiError | None = None
        try:
            if not await self.backend.scale(
                plan.name, plan.version, plan.min_workers, plan.max_workers, float(plan.startup_timeout_s)
            ):
                why = f"workers did not start within startup_timeout={plan.startup_timeout_s} s"
                error = self._start_failed(plan, why)
        except ApiError as exc:  # e.g. a pinning the host's cores cannot hold: the caller's 400, as it was
            error = exc
        except WorkerError as exc:
            error = self._start_failed(plan, str(exc))
        except Exception as exc:  # a bug or the OS (a spawn that fails): still nothing left registered
            log.exception("starting the workers of %s version %s failed", plan.name, plan.version)
            error = self._start_failed(plan, f"{type(exc).__name__}: {exc}")
        if error is not None:
            await self._remove_quietly(plan)
            raise error

    @staticmethod
    def _start_failed(plan: VersionPlan, why: str) -> ApiError:
        return ApiError.internal(f"Failed to start workers for model {plan.name} version {plan.version}: {why}")

    async def _remove_quietly(self, plan: VersionPlan) -> None:
        """Unregister a version whose registration failed; a second failure is logged, not raised over the first."""
        try:
            await self.backend.remove(plan.name, plan.version, 0.0)
        except ApiError as exc:
            if exc.status != 404:  # already gone
                log.error("could not remove %s version %s after a failed start: %s", plan.name, plan.version, exc)
        except Exception:
            log.exception("could not remove %s version %s after a failed start", plan.name, plan.version)

    async def scale(
        self, name: str, version: str | None, workers: tuple[int, int], synchronous: bool, wait_s: float
    ) -> tuple[int, str]:
        if not synchronous:
            self.spawn(self.backend.scale(name, version, *workers, 0.0))
            return 202, "Processing worker updates..."
        try:
            done = await self.backend.scale(name, version, *workers, wait_s)
        except WorkerError as exc:
            raise ApiError.internal(f"Failed to start workers for model {name}: {exc}") from None
        if not done:
            return 206, "Workers scaling in progress..."
        suffix = "" if version is None else f", version: {version}"
        return 200, f"Workers scaled to {workers[0]} for model: {name}{suffix}"

    async def reconfigure(self, name: str, version: str | None, change: Reconfigure) -> str:
        await self.backend.reconfigure(name, version, change)
        status = await self.backend.status(name, version)
        parts = []
        if change.batch_size is not None or change.max_batch_delay_ms is not None:
            parts.append(
                f"Batching set to batch_size={status.batch_size}, max_batch_delay={status.max_batch_delay_ms} "
                f"for model: {name}"
            )
        if change.num_threads is not None or change.inter_op_threads is not None or change.cpu_pinning is not None:
            parts.append(
                f"Threads set to num_threads={status.num_threads}, inter_op_threads={status.inter_op_threads}, "
                f"cpu_pinning={str(status.cpu_pinning).lower()} for model: {name}"
            )
        return "; ".join(parts)

    async def unregister(self, name: str, version: str | None) -> str:
        refs = self.versions(name, version)
        everything = self.versions(name, "all")
        if version is not None and refs[0].is_default and len(everything) > 1:
            raise ApiError.invalid_version(f"Cannot remove default version {version} for model {name}")
        await self.backend.remove(name, version, self.config.shutdown_grace_period)
        return f'Model "{name}" unregistered'

    async def customized_metadata(self, name: str, version: str) -> Any:
        """Ask the handler (``describe_handle``) through a describe request in a batch of its own, as TorchServe."""
        body = [Input("body", None, b"")]
        request = InferRequest(str(uuid.uuid4()), {}, body, time.monotonic(), control=Control(describe=True))
        try:
            result = await self.backend.infer(name, version, request)
        except ApiError as exc:
            if exc.status != 503:
                raise
            raise ApiError.unavailable(f"Model {name} has no worker available to describe it") from None
        if result.status != 200:
            raise ApiError.internal(f"Describe failed for model {name}: {result.body.decode(errors='replace')}")
        try:
            value = json.loads(result.body) if result.body.strip() else None
        except json.JSONDecodeError:
            return result.body.decode(errors="replace")
        return {} if value is None else value  # no metadata (a handler without describe_handle): {}, as TorchServe

    # ---- background work ---------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._background.discard(t)
            error = None if t.cancelled() else t.exception()
            if isinstance(error, ApiError) and error.status == 404:  # unregistered meanwhile: nothing left to update
                log.info("background worker update stopped: %s", error)
            elif error is not None:
                log.error("background worker update failed: %s", error)

        task.add_done_callback(done)

    def cancel_background(self) -> None:
        for task in list(self._background):
            task.cancel()


def create_management_app(management: Management, gateway: Gateway) -> Starlette:
    """TorchServe's management API over ``management``; ``gateway`` checks the keys (``servetune.api.gateway``)."""
    config = management.config
    tokens = gateway.tokens

    def model_api_enabled() -> None:
        if not config.enable_model_api:
            raise ApiError.method_not_allowed()

    async def models(request: Request, who: Caller) -> Response:
        if request.method == "GET":
            return json_response(management.list_models(request.query_params))
        model_api_enabled()
        params = p.register_params(await p.request_params(request), config.max_workers_per_model)
        status, message = await management.register(params)
        return json_response({"status": message}, status)

    async def model(request: Request, who: Caller) -> Response:
        name = request.path_params["name"]
        version = request.path_params.get("version")
        if request.method == "GET":
            customized = request.query_params.get("customized", "").lower() == "true"
            return json_response(await management.describe(name, version, customized))
        if request.method == "DELETE":
            model_api_enabled()
            return json_response({"status": await management.unregister(name, version)})
        # PUT: scale workers, and (servetune's extension) change batching and threads in place
        params = dict(request.query_params)
        version = version or params.get("model_version")
        management.versions(name, version)
        change = p.reconfigure_params(params)
        scaling = change.empty or "min_worker" in params or "max_worker" in params
        workers = p.scale_params(params, config.max_workers_per_model)  # validated before anything changes
        wait_s = float(p.scale_timeout(params) or SCALE_WAIT_S)
        messages = []
        if not change.empty:
            if "min_worker" in params or "max_worker" in params:
                change = replace(change, for_workers=workers[0])
            messages.append(await management.reconfigure(name, version, change))
        status = 200
        if scaling:
            status, scaled = await management.scale(
                name, version, workers, p.java_bool(params, "synchronous", False), wait_s
            )
            messages.append(scaled)
        return json_response({"status": "; ".join(messages)}, status)

    async def set_default(request: Request, who: Caller) -> Response:
        name, version = request.path_params["name"], request.path_params["version"]
        return json_response({"status": await management.set_default(name, version)})

    async def token(request: Request, who: Caller) -> Response:
        if tokens is None:
            raise ApiError.bad_request("Token authorization is disabled")
        kind = request.query_params.get("type", "")
        if kind not in ("management", "inference"):
            raise ApiError.bad_request(f"type must be management or inference, got {kind!r}")
        return json_response({kind: {"key": tokens.regenerate(kind)}})

    async def api_description(request: Request, who: Caller) -> Response:
        return json_response(management_spec())

    routes = [
        route(gateway, "/", api_description, ["OPTIONS"], OPEN),
        route(gateway, "/api-description", api_description, ["GET", "OPTIONS"], OPEN),
        route(gateway, "/models", models, ["GET", "POST"], MANAGEMENT),
        route(gateway, "/models/{name}", model, ["GET", "PUT", "DELETE"], MANAGEMENT),
        route(gateway, "/models/{name}/{version}", model, ["GET", "PUT", "DELETE"], MANAGEMENT),
        route(gateway, "/models/{name}/{version}/set-default", set_default, ["PUT"], MANAGEMENT),
        route(gateway, "/token", token, ["GET"], TOKEN_API),
    ]
    return Starlette(routes=routes, exception_handlers=exception_handlers())


__all__ = ["Management", "create_management_app"]
