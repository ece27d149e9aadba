"""The Ray Serve config file (``serve deploy`` / KubeRay ``serveConfigV2``) for a set of planned models.

One application per model name at ``/predictions/<name>`` whose ingress is the default version's deployment (the
proxy hands each request straight to a replica: one hop), plus a small ``servetune`` application at ``/`` for
``/ping`` and TorchServe's 404s. Knobs: workers -> ``num_replicas`` (``autoscaling_config`` when max > min),
batch size and delay -> ``@serve.batch`` max size and wait, through ``user_config`` (changed in place by
``reconfigure``), ``deviceType: gpu`` -> one GPU per replica.

Only ``num_replicas``/``autoscaling_config``/``user_config``/``max_ongoing_requests`` changes keep replicas: Ray
hashes the import path and args into the code version, so anything else redeploys the application. The args carry
each version's plan as its replicas load it (the handler's context at ``initialize``); ``user_config`` the live
batch size, delay and threads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from servetune.config.server import ServerConfig
from servetune.ray.plan import FRONTEND_APP, ModelPlan, RayVersion, deployment_name

MODEL_APP_IMPORT = "servetune.ray.app:model_app"
FRONTEND_APP_IMPORT = "servetune.ray.app:frontend_app"
FRONTEND_DEPLOYMENT = "Frontend"
DEFAULT_ONGOING_BATCHES = 2
# the server settings a replica's inference API needs
SERVER_KEYS = (
    "max_request_size",
    "max_response_size",
    "max_tensor_elements",
    "max_tensor_dims",
    "max_empty_tensor_span",
)


def server_settings(config: ServerConfig) -> dict[str, Any]:
    return {key: getattr(config, key) for key in SERVER_KEYS}


def max_ongoing_requests(batch_size: int, batches: int = DEFAULT_ONGOING_BATCHES) -> int:
    """Requests a replica holds at once: ``batches`` batches (model-config ``rayOngoingBatches``, default 2: one
    running and the next forming meanwhile; with room for one batch only, a replica idles between batches while the
    proxy sends it more: resnet18 on 2 cores at batch 4 served 0.60x the native server instead of 0.74x). With 1,
    no request waits behind a busy replica while another is idle, which matters when a batch takes long (Ray's
    router sometimes puts two requests on one replica). Ray's proxy prefers the replicas on its own node until
    they are full; a cluster gets a proxy per node behind a load balancer (docs/scale-out.md)."""
    return batches * batch_size


def deployment_options(plan: RayVersion) -> dict[str, Any]:
    options: dict[str, Any] = {
        "name": deployment_name(plan.name, plan.version),
        "max_ongoing_requests": max_ongoing_requests(plan.batch_size, plan.ongoing_batches),
        "max_queued_requests": plan.plan.job_queue_size,
        "user_config": plan.user_config(),
        "ray_actor_options": {"num_cpus": plan.num_cpus, "num_gpus": 1 if plan.plan.gpu else 0},
        "graceful_shutdown_timeout_s": max(5.0, float(plan.plan.response_timeout_s)),
        "health_check_period_s": 2.0,
        "health_check_timeout_s": 30.0,
    }
    if plan.autoscaling:
        options["autoscaling_config"] = {
            "min_replicas": plan.min_workers,
            "max_replicas": plan.max_workers,
            "initial_replicas": plan.min_workers,
            "target_ongoing_requests": plan.batch_size,
        }
    else:
        options["num_replicas"] = plan.min_workers
    return options


def model_application(model: ModelPlan, server: dict[str, Any]) -> dict[str, Any]:
    """The model's application; versions scaled to 0 workers have no deployment and answer 503 (as TorchServe)."""
    serving = {v: plan for v, plan in sorted(model.versions.items()) if plan.serving}
    return {
        "name": model.name,
        "route_prefix": f"/predictions/{model.name}",
        "import_path": MODEL_APP_IMPORT,
        "args": {
            "model": model.name,
            "default_version": model.default_version,
            "versions": {v: plan.plan.to_json() for v, plan in serving.items()},
            "idle_versions": sorted(v for v in model.versions if v not in serving),
            "server": server,
        },
        "deployments": [deployment_options(plan) for plan in serving.values()],
    }


def frontend_application(
    models: list[ModelPlan], server: dict[str, Any], starting: bool = False, failed: dict[str, str] | None = None
) -> dict[str, Any]:
    """``/ping`` over the served models (Unhealthy while ``starting`` or when a start-up model ``failed``); models
    whose default version has 0 workers are answered 503 here."""
    return {
        "name": FRONTEND_APP,
        "route_prefix": "/",
        "import_path": FRONTEND_APP_IMPORT,
        "args": {
            "models": sorted(m.name for m in models if m.serving),
            "idle_models": sorted(m.name for m in models if not m.serving),
            "versions": {
                m.name: {
                    "default": m.default_version,
                    "serving": sorted(v for v, p in m.versions.items() if p.serving),
                    "idle": sorted(v for v, p in m.versions.items() if not p.serving),
                }
                for m in models
            },
            "starting": starting,
            "failed": dict(failed or {}),
            "server": server,
        },
        "deployments": [{"name": FRONTEND_DEPLOYMENT, "num_replicas": 1, "ray_actor_options": {"num_cpus": 0}}],
    }


def serve_config(
    models: list[ModelPlan],
    *,
    host: str = "0.0.0.0",
    port: int = 8000,
    proxy_location: str = "EveryNode",
    server: dict[str, Any] | None = None,
    starting: bool = False,
    failed: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A multi-application Ray Serve config, valid for ``serve deploy`` and KubeRay's ``serveConfigV2``. ``server``:
    the settings the inference API needs in the replicas (``servetune.ray.app.SERVER_KEYS``)."""
    server = dict(server or {})
    return {
        "proxy_location": proxy_location,
        "http_options": {"host": host, "port": port},
        "applications": [
            frontend_application(models, dict(server), starting, failed),
            *(model_application(m, dict(server)) for m in models if m.serving),
        ],
    }


def write_serve_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


__all__ = [
    "SERVER_KEYS",
    "deployment_options",
    "max_ongoing_requests",
    "serve_config",
    "server_settings",
    "write_serve_config",
]
