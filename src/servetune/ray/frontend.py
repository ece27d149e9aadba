"""The ``servetune`` application at ``/``: every path no model application owns (``/ping``, the API description,
``/predictions/<model>`` of a model that is not served), answered by the API layer's inference app.

Predictions of served models never pass through here: Ray's proxy routes ``/predictions/<name>`` straight to that
model's application. ``/ping`` is Healthy once the driver has loaded its start-up models (none failed) and every
servetune application is running with each deployment healthy or scaling, as TorchServe's is while each model has
its minimum of healthy workers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from typing import Any

from ray import serve
from ray.exceptions import RayError
from starlette.requests import Request
from starlette.responses import Response

from servetune._exceptions import ApiError
from servetune.api.inference import create_inference_app
from servetune.api.metrics import ApiMetrics
from servetune.api.types import InferRequest, InferResult, ModelMetadata, ModelRef, Readiness
from servetune.config.server import ServerConfig
from servetune.ray.asgi import call_app
from servetune.ray.controller import state_name
from servetune.ray.metrics import Reporter
from servetune.ray.plan import deployment_name
from servetune.ray.serve_config import SERVER_KEYS

HEALTH_CACHE_S = 1.0
HEALTHY_DEPLOYMENT_STATES = ("HEALTHY", "UPSCALING", "DOWNSCALING")


def deployment_ready(name: str, version: str) -> bool:
    """The version's deployment is healthy (or scaling) with a running replica."""
    app = serve.status().applications.get(name)
    deployment = app.deployments.get(deployment_name(name, version)) if app is not None else None
    if deployment is None or state_name(deployment.status) not in HEALTHY_DEPLOYMENT_STATES:
        return False
    return any(n for state, n in deployment.replica_states.items() if state_name(state) == "RUNNING")


def cluster_healthy(models: list[str]) -> bool:
    """Every model application RUNNING, every deployment healthy (or scaling) with a running replica."""
    status = serve.status()
    for name in models:
        app = status.applications.get(name)
        if app is None or state_name(app.status) != "RUNNING":
            return False
        for deployment in app.deployments.values():
            if state_name(deployment.status) not in HEALTHY_DEPLOYMENT_STATES:
                return False
            running = sum(n for state, n in deployment.replica_states.items() if state_name(state) == "RUNNING")
            if running == 0:
                return False
    return True


class FrontendView:
    """The inference API's backend at ``/``. ``/predictions`` of a served model never reaches it (the model's own
    application takes it); any other request for a model (a path its application does not own) goes to the version's
    deployment through a handle."""

    def __init__(self, models: list[str], idle: set[str], versions: dict[str, dict[str, Any]] | None = None) -> None:
        self.served = list(models)
        self.idle = idle
        self.versions = versions or {name: {"default": "", "serving": [], "idle": []} for name in {*models, *idle}}
        self._health: tuple[float, bool] = (0.0, False)
        self._ready: dict[str, tuple[float, bool]] = {}

    def _version(self, name: str, version: str | None) -> tuple[str, bool]:
        """The version meant (the default when None) and whether it has replicas; raises ApiError 404."""
        known = self.versions.get(name)
        if known is None:
            raise ApiError.model_not_found(name)
        version = version or str(known["default"])
        if version in known["idle"] or name in self.idle:
            return version, False
        if version not in known["serving"]:
            raise ApiError.version_not_found(name, version)
        return version, True

    async def infer(self, name: str, version: str | None, request: InferRequest) -> InferResult:
        version, serving = self._version(name, version)
        if not serving:
            raise ApiError.no_worker(name)
        handle = serve.get_deployment_handle(deployment_name(name, version), app_name=name)
        try:
            result: InferResult = await handle.infer_remote.remote(dataclasses.replace(request, is_disconnected=None))
        except RayError as exc:
            raise ApiError.unavailable(f"Worker died while running this request: {exc}") from None
        return result

    def models(self) -> list[ModelRef]:
        return [
            ModelRef(name, version, "", version == info["default"])
            for name, info in sorted(self.versions.items())
            for version in sorted({*info["serving"], *info["idle"]})
        ]

    async def healthy(self) -> bool:
        checked, healthy = self._health
        if time.monotonic() - checked > HEALTH_CACHE_S:
            try:
                healthy = await asyncio.to_thread(cluster_healthy, self.served)
            except Exception:  # noqa: BLE001 - the controller unreachable or restarting: not healthy
                healthy = False
            self._health = (time.monotonic(), healthy)
        return healthy

    async def ready(self, name: str, version: str | None) -> bool:
        """A version scaled to 0 workers needs none (TorchServe's rule: minWorkers ready); else its deployment must
        be healthy with a running replica."""
        version, serving = self._version(name, version)
        if not serving:
            return True
        key = f"{name}/{version}"
        checked, ready = self._ready.get(key, (0.0, False))
        if time.monotonic() - checked > HEALTH_CACHE_S:
            try:
                ready = await asyncio.to_thread(deployment_ready, name, version)
            except Exception:  # noqa: BLE001 - the controller unreachable or restarting: not ready
                ready = False
            self._ready[key] = (time.monotonic(), ready)
        return ready

    async def metadata(self, name: str, version: str | None) -> ModelMetadata:
        version, serving = self._version(name, version)
        info = self.versions[name]
        versions = tuple(sorted({*info["serving"], *info["idle"]}))
        if not serving:
            return ModelMetadata(name, versions, "")  # no replica holds its plan: no tensors
        handle = serve.get_deployment_handle(deployment_name(name, version), app_name=name)
        try:
            metadata: ModelMetadata = await handle.metadata_remote.remote()
        except RayError as exc:
            raise ApiError.unavailable(f"Worker died while reading the model's metadata: {exc}") from None
        return metadata


class Frontend:
    def __init__(
        self,
        models: list[str],
        idle_models: list[str] | None = None,
        starting: bool = False,
        failed: dict[str, str] | None = None,
        server: dict[str, Any] | None = None,
        versions: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.view = FrontendView(models, set(idle_models or ()), versions)
        config = ServerConfig(**{k: v for k, v in (server or {}).items() if k in SERVER_KEYS})
        readiness = Readiness(starting=starting, failed=dict(failed or {}))
        # the requests answered here through handles (KServe v1, OIP v2, other versions) are counted here
        self.metrics = ApiMetrics()
        self.reporter = Reporter(self.metrics.registry, f"frontend/{os.getpid()}")
        self.app = create_inference_app(self.view, config, metrics=self.metrics, readiness=readiness)

    async def __call__(self, request: Request) -> Response:
        self.reporter.ensure_started()
        return await call_app(self.app, request)


__all__ = ["Frontend", "FrontendView", "cluster_healthy"]
