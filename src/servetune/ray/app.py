"""Application builders named by the Ray Serve config's ``import_path`` (``servetune.ray.app:model_app``).

Ray calls a builder with the application's ``args`` and deploys what it returns; the config's ``deployments``
section then sets each deployment's replicas, resources and ``user_config`` by name.
"""

from __future__ import annotations

from typing import Any, cast

from ray import serve
from ray.serve import Application, Deployment

from servetune.ray.frontend import Frontend
from servetune.ray.plan import deployment_name
from servetune.ray.replica import ModelReplica
from servetune.ray.serve_config import FRONTEND_DEPLOYMENT


def model_app(args: dict[str, Any]) -> Application:
    """One model: the default version's deployment is the ingress; other versions are reached through handles."""
    model = str(args["model"])
    versions: dict[str, dict[str, Any]] = args["versions"]
    default = str(args["default_version"])
    if default not in versions:
        raise ValueError(f"default_version={default!r} is not one of {sorted(versions)}")
    server = dict(args.get("server") or {})
    idle = list(args.get("idle_versions", []))
    replica = cast(Deployment, serve.deployment(ModelReplica))
    others = {
        version: replica.options(name=deployment_name(model, version)).bind(plan, {}, idle, server, default)
        for version, plan in versions.items()
        if version != default
    }
    return replica.options(name=deployment_name(model, default)).bind(versions[default], others, idle, server, default)


def frontend_app(args: dict[str, Any]) -> Application:
    """``/ping``, the API description and the 404s."""
    frontend = cast(Deployment, serve.deployment(Frontend))
    return frontend.options(name=FRONTEND_DEPLOYMENT).bind(
        list(args.get("models", [])),
        list(args.get("idle_models", [])),
        bool(args.get("starting", False)),
        dict(args.get("failed") or {}),
        dict(args.get("server") or {}),
        dict(args.get("versions") or {}),
    )


__all__ = ["frontend_app", "model_app"]
