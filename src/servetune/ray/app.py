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
from servetune.ray.serve_config import FRONTEND_DEPLOYMENT, FrontendArgs, ModelArgs


def model_app(args: dict[str, Any]) -> Application:
    """One model: the default version's deployment is the ingress; the other deployed versions are bound to it (so
    that Ray deploys them with the application) and reached through their handles."""
    shipped = ModelArgs.from_json(args)
    model, server = shipped.model, shipped.server
    replica = cast(Deployment, serve.deployment(ModelReplica))
    others = {
        version: replica.options(name=deployment_name(model.name, version)).bind(model, plan, {}, server)
        for version, plan in shipped.plans.items()
        if version != model.default
    }
    ingress = replica.options(name=deployment_name(model.name, model.default))
    return ingress.bind(model, shipped.plans[model.default], others, server)


def frontend_app(args: dict[str, Any]) -> Application:
    """``/ping``, the API description and the 404s."""
    frontend = cast(Deployment, serve.deployment(Frontend))
    return frontend.options(name=FRONTEND_DEPLOYMENT).bind(FrontendArgs.from_json(args).server)


__all__ = ["frontend_app", "model_app"]
