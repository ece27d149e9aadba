"""Application builders named by the Ray Serve config's ``import_path`` (``servetune.ray.app:model_app``).

Ray calls a builder with the application's ``args`` and deploys what it returns; the config's ``deployments``
section then sets each deployment's replicas, resources and ``user_config`` by name. The args are read here, once,
into their typed form (``servetune.ray.serve_config``); the replicas and the frontend get typed values.
"""

from __future__ import annotations

from typing import Any, cast

from ray import serve
from ray.serve import Application, Deployment

from servetune.ray.frontend import Frontend
from servetune.ray.plan import deployment_name
from servetune.ray.replica import ModelReplica
from servetune.ray.serve_config import FRONTEND_DEPLOYMENT, FrontendArgs, VersionArgs


def model_app(args: dict[str, Any]) -> Application:
    """One model version: its deployment (the model's ingress when it is the default; the ingress reaches the other
    versions through their handles)."""
    shipped = VersionArgs.from_json(args)
    replica = cast(Deployment, serve.deployment(ModelReplica))
    return replica.options(name=deployment_name(shipped.plan.name, shipped.plan.version)).bind(
        shipped.plan, shipped.server
    )


def frontend_app(args: dict[str, Any]) -> Application:
    """``/ping``, the API description and the 404s."""
    frontend = cast(Deployment, serve.deployment(Frontend))
    return frontend.options(name=FRONTEND_DEPLOYMENT).bind(FrontendArgs.from_json(args).server)


__all__ = ["frontend_app", "model_app"]
