"""The ``servetune`` application at ``/``: ``GET /ping`` and TorchServe's 404s for every path no model owns.

Predictions never pass through here: Ray's proxy routes ``/predictions/<name>`` straight to that model's
application. ``/ping`` is Healthy while every servetune application is running with each deployment healthy or
scaling, as TorchServe's is while each model has its minimum of healthy workers.
"""

from __future__ import annotations

import asyncio
import time

from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from servetune.ray.controller import state_name
from servetune.ray.plan import no_worker_message
from servetune.server.http import METHOD_NOT_ALLOWED_MESSAGE, NOT_FOUND_MESSAGE, error_response, json_response

HEALTH_CACHE_S = 1.0
HEALTHY_DEPLOYMENT_STATES = ("HEALTHY", "UPSCALING", "DOWNSCALING")


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


class Frontend:
    def __init__(self, models: list[str], idle_models: list[str] | None = None) -> None:
        self.models = list(models)
        self.idle = set(idle_models or ())
        self._health: tuple[float, bool] = (0.0, False)

    async def healthy(self) -> bool:
        checked, healthy = self._health
        if time.monotonic() - checked > HEALTH_CACHE_S:
            try:
                healthy = await asyncio.to_thread(cluster_healthy, self.models)
            except Exception:  # noqa: BLE001 - the controller unreachable or restarting: not healthy
                healthy = False
            self._health = (time.monotonic(), healthy)
        return healthy

    async def __call__(self, request: Request) -> Response:
        path = request.scope["path"].rstrip("/") or "/"
        parts = path.strip("/").split("/")
        if parts == ["ping"]:
            if request.method not in ("GET", "POST"):
                return error_response(405, "MethodNotAllowedException", METHOD_NOT_ALLOWED_MESSAGE)
            if await self.healthy():
                return json_response({"status": "Healthy"})
            return json_response({"status": "Unhealthy"}, 500)
        if parts[0] == "predictions" and len(parts) in (2, 3) and parts[1] in self.idle:
            message = no_worker_message(parts[1])
            return error_response(503, "ServiceUnavailableException", message, {"Retry-After": "1"})
        if parts[0] == "predictions" and len(parts) in (2, 3):
            # the model's own application would have taken it: the model is not served
            return error_response(404, "ModelNotFoundException", f"Model not found: {parts[1]}")
        return error_response(404, "ResourceNotFoundException", NOT_FOUND_MESSAGE)


__all__ = ["Frontend", "cluster_healthy"]
