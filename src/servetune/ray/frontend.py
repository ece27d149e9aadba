"""The ``servetune`` application at ``/``: every path no model application owns (``/ping``, the API description,
``/predictions/<model>`` of a model that is not served), answered by the API layer's inference app.

Predictions of served models never pass through here: Ray's proxy routes ``/predictions/<name>`` straight to that
model's application. ``/ping`` is Healthy once the driver has loaded its start-up models (none failed) and every
servetune application is running with each deployment healthy or scaling, as TorchServe's is while each model has
its minimum of healthy workers.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from typing import Any

from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from servetune._exceptions import ApiError
from servetune.api.inference import create_inference_app
from servetune.api.metrics import ApiMetrics
from servetune.api.types import InferRequest, InferResult, ModelMetadata, ModelRef, Readiness
from servetune.config.server import ServerConfig
from servetune.ray import handles
from servetune.ray.asgi import call_app
from servetune.ray.controller import state_name
from servetune.ray.metrics import Reporter
from servetune.ray.plan import Resolved, ServedModel, deployment_name
from servetune.ray.serve_config import FrontendArgs

HEALTH_CACHE_S = 1.0
HEALTHY_DEPLOYMENT_STATES = ("HEALTHY", "UPSCALING", "DOWNSCALING")


def deployment_ready(name: str, version: str) -> bool:
    """The version's deployment is healthy (or scaling) with a running replica."""
    app_name = deployment_name(name, version)  # the version's application is named as its deployment
    app = serve.status().applications.get(app_name)
    deployment = app.deployments.get(app_name) if app is not None else None
    if deployment is None or state_name(deployment.status) not in HEALTHY_DEPLOYMENT_STATES:
        return False
    return any(n for state, n in deployment.replica_states.items() if state_name(state) == "RUNNING")


def served_applications(models: Sequence[ServedModel]) -> list[str]:
    """The applications of the models' deployed versions."""
    return [deployment_name(model.name, version) for model in models for version in model.deployed]


def cluster_healthy(applications: list[str]) -> bool:
    """Every named application RUNNING, every deployment healthy (or scaling) with a running replica."""
    status = serve.status()
    for name in applications:
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
    """The inference API's backend at ``/``. ``/predictions`` of a model whose default version has workers never
    reaches it (the default's application takes it); any other request for a model (a path no application owns:
    KServe's and OIP's, or any ``/predictions`` while the default has no workers) goes to the version's deployment
    through a handle."""

    def __init__(self, models: Sequence[ServedModel]) -> None:
        self.serve(models)

    def serve(self, models: Sequence[ServedModel]) -> None:
        """Answer for ``models`` from now on (what was cached of the models before is forgotten)."""
        self.models_served = {model.name: model for model in models}
        self.served = served_applications(models)
        self._health: tuple[float, bool] = (0.0, False)
        self._ready: dict[str, tuple[float, bool]] = {}

    def _resolve(self, name: str, version: str | None) -> Resolved:
        model = self.models_served.get(name)
        if model is None:
            raise ApiError.model_not_found(name)
        return model.resolve(version)

    async def infer(self, name: str, version: str | None, request: InferRequest) -> InferResult:
        meant, deployed = self._resolve(name, version)
        if not deployed:
            raise ApiError.no_worker(name)
        return await handles.infer(handles.version_handle(name, meant), request)

    def models(self) -> list[ModelRef]:
        return [ref for _, model in sorted(self.models_served.items()) for ref in model.refs()]

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
        meant, deployed = self._resolve(name, version)
        if not deployed:
            return True
        key = f"{name}/{meant}"
        checked, ready = self._ready.get(key, (0.0, False))
        if time.monotonic() - checked > HEALTH_CACHE_S:
            try:
                ready = await asyncio.to_thread(deployment_ready, name, meant)
            except Exception:  # noqa: BLE001 - the controller unreachable or restarting: not ready
                ready = False
            self._ready[key] = (time.monotonic(), ready)
        return ready

    async def metadata(self, name: str, version: str | None) -> ModelMetadata:
        meant, deployed = self._resolve(name, version)
        if not deployed:
            return ModelMetadata(name, self.models_served[name].versions, "")  # no replica holds its plan: no tensors
        return await handles.metadata(handles.version_handle(name, meant))


class Frontend:
    """Deployment class of the ``servetune`` application: the API layer's inference app over :class:`FrontendView`.
    Built with the API settings; the models served and the start-up state come in its ``user_config``
    (:meth:`reconfigure`, called before the replica serves and on every change, in place)."""

    def __init__(self, server: ServerConfig) -> None:
        self.view = FrontendView(())
        self.readiness = Readiness(starting=True)
        # the requests answered here through handles (KServe v1, OIP v2, other versions) are counted here
        self.metrics = ApiMetrics()
        self.reporter = Reporter(self.metrics.registry, f"frontend/{os.getpid()}")
        self.app = create_inference_app(self.view, server, metrics=self.metrics, readiness=self.readiness)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        told = FrontendArgs.from_json({}, user_config)
        self.view.serve(told.models)
        handles.keep_deployed(told.models)
        self.readiness.starting, self.readiness.failed = told.starting, dict(told.failed)

    async def __call__(self, request: Request) -> Response:
        self.reporter.ensure_started()
        return await call_app(self.app, request)


__all__ = ["Frontend", "FrontendView", "cluster_healthy", "served_applications"]
