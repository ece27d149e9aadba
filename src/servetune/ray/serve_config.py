"""The Ray Serve config file (``serve deploy`` / KubeRay ``serveConfigV2``) for a set of planned models.

One application per deployed model version, named as its deployment (``resnet18_v1_0``); the default version's is at
``/predictions/<name>`` (its replicas are the model's ingress: the proxy hands each request straight to one, one hop)
and the others have no route (the ingress reaches them through their handles); plus a small ``servetune``
application at ``/`` for ``/ping`` and TorchServe's 404s. Knobs: workers -> ``num_replicas``
(``autoscaling_config`` when max > min), batch size and delay -> ``@serve.batch`` max size and wait, through
``user_config`` (changed in place by ``reconfigure``), ``deviceType: gpu`` -> one GPU per replica.

Only ``num_replicas``/``autoscaling_config``/``user_config``/``max_ongoing_requests``/``route_prefix`` changes keep
replicas: Ray hashes the import path and args into the application's code version, so a change of the args replaces
every replica of the application. Hence an application per version, whose args are only what its replicas load
with (:class:`VersionArgs`: the version's plan and the API settings): registering, scaling or removing one version,
or making another the default, never replaces another version's replicas. What changes as versions come and go (the
model as served: its versions, which are deployed, its default) is each deployment's ``user_config``, applied in
place by ``reconfigure``; the same holds for the frontend (:class:`FrontendArgs`: only the API settings in its args,
the models served and the start-up state in its ``user_config``), so that the replica that answers ``/ping`` is never
replaced. The args are typed at both ends: written here with ``to_json``, read back by the application builders
(``servetune.ray.app``) with ``from_json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from servetune.api.plan import VersionPlan
from servetune.config.server import ServerConfig
from servetune.ray.plan import FRONTEND_APP, ONGOING_BATCHES, ModelPlan, RayVersion, ServedModel, deployment_name

MODEL_APP_IMPORT = "servetune.ray.app:model_app"
FRONTEND_APP_IMPORT = "servetune.ray.app:frontend_app"
FRONTEND_DEPLOYMENT = "Frontend"
# the server settings a replica's inference API needs
SERVER_KEYS = (
    "max_request_size",
    "max_response_size",
    "max_tensor_elements",
    "max_tensor_dims",
    "max_empty_tensor_span",
)


def server_settings(config: ServerConfig) -> dict[str, Any]:
    """The settings of ``config`` that the replicas' and the frontend's inference API needs, as the args carry them."""
    return {key: getattr(config, key) for key in SERVER_KEYS}


def api_config(settings: Any) -> ServerConfig:
    """The inference API's config from :func:`server_settings`' form (other keys, if any, are ignored)."""
    if not isinstance(settings, dict):
        raise ValueError(f"server: expected a mapping of {', '.join(SERVER_KEYS)}, got {settings!r}")
    return ServerConfig(**{k: v for k, v in settings.items() if k in SERVER_KEYS})


@dataclass(frozen=True)
class VersionArgs:
    """A version's application args: what its replicas are built from (``servetune.ray.app:model_app``)."""

    plan: VersionPlan  # the version's plan, as its replicas load it
    server: ServerConfig = field(default_factory=ServerConfig)

    def to_json(self) -> dict[str, Any]:
        return {"version": self.plan.to_json(), "server": server_settings(self.server)}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> VersionArgs:
        plan = raw.get("version")
        if not isinstance(plan, dict):
            raise ValueError(f"version: expected the version's plan (a mapping), got {plan!r}")
        return cls(VersionPlan.from_json(plan), api_config(raw.get("server") or {}))


def served_model(user_config: dict[str, Any], plan: VersionPlan) -> ServedModel:
    """The model as served, from a version deployment's ``user_config`` (before Ray passes one: the version alone)."""
    raw = user_config.get("model")
    if raw is None:
        return ServedModel(plan.name, plan.version, (plan.version,), (plan.version,))
    return ServedModel.from_json(raw)


@dataclass(frozen=True)
class FrontendArgs:
    """The frontend application's args (``servetune.ray.app:frontend_app``): every model as served, whether the
    driver is still loading its start-up models, those that failed, and the API settings."""

    models: tuple[ServedModel, ...] = ()
    starting: bool = False
    failed: dict[str, str] = field(default_factory=dict)
    server: ServerConfig = field(default_factory=ServerConfig)

    def to_json(self) -> dict[str, Any]:
        """The application's args: what the frontend is built with (a change replaces its replica)."""
        return {"server": server_settings(self.server)}

    def user_config(self) -> dict[str, Any]:
        """The deployment's ``user_config``: what changes as models come and go (applied in place)."""
        return {"models": [m.to_json() for m in self.models], "starting": self.starting, "failed": dict(self.failed)}

    @classmethod
    def from_json(cls, raw: dict[str, Any], user_config: dict[str, Any] | None = None) -> FrontendArgs:
        """From the application's args and the deployment's ``user_config`` (None: no models, not starting)."""
        changing = user_config or {}
        if not isinstance(changing, dict):
            raise ValueError(f"user_config: expected a mapping of models, starting and failed, got {changing!r}")
        models = changing.get("models") or []
        failed = changing.get("failed") or {}
        if not isinstance(models, list) or not isinstance(failed, dict):
            raise ValueError("models: expected a list of served models; failed: a mapping of model -> error")
        return cls(
            tuple(ServedModel.from_json(m) for m in models),
            bool(changing.get("starting", False)),
            {str(k): str(v) for k, v in failed.items()},
            api_config(raw.get("server") or {}),
        )

    @classmethod
    def of_application(cls, app: dict[str, Any]) -> FrontendArgs:
        """What the frontend application of a Serve config (``frontend_application``'s form) is told."""
        [deployment] = app["deployments"]
        return cls.from_json(app.get("args") or {}, deployment.get("user_config"))


def max_ongoing_requests(batch_size: int, batches: int = ONGOING_BATCHES) -> int:
    """Requests a replica holds at once: ``batches`` batches (model-config ``rayOngoingBatches``, default 2: one
    running and the next forming meanwhile; with room for one batch only, a replica idles between batches while the
    proxy sends it more: resnet18 on 2 cores at batch 4 served 0.60x the native server instead of 0.74x). With 1,
    no request waits behind a busy replica while another is idle, which matters when a batch takes long (Ray's
    router sometimes puts two requests on one replica). Ray's proxy prefers the replicas on its own node until
    they are full; a cluster gets a proxy per node behind a load balancer (docs/scale-out.md)."""
    return batches * batch_size


def deployment_options(plan: RayVersion, served: ServedModel) -> dict[str, Any]:
    """The version's deployment; ``served``: the model as served, told to its replicas in ``user_config``."""
    user_config: dict[str, Any] = {**plan.user_config(), "model": served.to_json()}
    options: dict[str, Any] = {
        "name": deployment_name(plan.name, plan.version),
        "max_ongoing_requests": max_ongoing_requests(plan.batch_limit, plan.ongoing_batches),
        "max_queued_requests": plan.plan.job_queue_size,
        "user_config": user_config,
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


def version_applications(model: ModelPlan, server: ServerConfig) -> list[dict[str, Any]]:
    """An application per deployed version, the default's at ``/predictions/<name>``; versions scaled to 0 workers
    have none and answer 503 (as TorchServe); while the default has none, the frontend holds the model's route and
    reaches the other versions through their handles."""
    served = model.served
    return [
        {
            "name": deployment_name(model.name, version),
            "route_prefix": f"/predictions/{model.name}" if version == model.default_version else None,
            "import_path": MODEL_APP_IMPORT,
            "args": VersionArgs(model.versions[version].plan, server).to_json(),
            "deployments": [deployment_options(model.versions[version], served)],
        }
        for version in served.deployed
    ]


def frontend_application(
    models: list[ModelPlan], server: ServerConfig, starting: bool = False, failed: dict[str, str] | None = None
) -> dict[str, Any]:
    """``/ping`` over the served models (Unhealthy while ``starting`` or when a start-up model ``failed``); models
    whose default version has 0 workers are answered 503 here."""
    served = tuple(m.served for m in sorted(models, key=lambda m: m.name))
    args = FrontendArgs(served, starting, dict(failed or {}), server)
    return {
        "name": FRONTEND_APP,
        "route_prefix": "/",
        "import_path": FRONTEND_APP_IMPORT,
        "args": args.to_json(),
        "deployments": [
            {
                "name": FRONTEND_DEPLOYMENT,
                "num_replicas": 1,
                "user_config": args.user_config(),
                "ray_actor_options": {"num_cpus": 0},
            }
        ],
    }


def serve_config(
    models: list[ModelPlan],
    *,
    host: str = "0.0.0.0",
    port: int = 8000,
    proxy_location: str = "EveryNode",
    server: ServerConfig | None = None,
    starting: bool = False,
    failed: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A multi-application Ray Serve config, valid for ``serve deploy`` and KubeRay's ``serveConfigV2``. ``server``:
    the server's config, of which the replicas' inference API gets the :data:`SERVER_KEYS` settings."""
    server = server or ServerConfig()
    return {
        "proxy_location": proxy_location,
        "http_options": {"host": host, "port": port},
        "applications": [
            frontend_application(models, server, starting, failed),
            *(app for m in models for app in version_applications(m, server)),
        ],
    }


def write_serve_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


__all__ = [
    "SERVER_KEYS",
    "FrontendArgs",
    "VersionArgs",
    "api_config",
    "deployment_options",
    "max_ongoing_requests",
    "serve_config",
    "served_model",
    "server_settings",
    "version_applications",
    "write_serve_config",
]
