"""Serve servetune archives on a Ray Serve cluster: ``servetune serve --backend ray [--ray-address ADDR]``.

The same ``.mar`` archives, handlers, variants and TorchServe HTTP surface as the native server, from the same API
layer (``servetune.api``) over :class:`RayBackend`: Ray Serve's replicas stand for workers, ``@serve.batch`` for the
batcher, and its proxy for the inference port. See docs/scale-out.md. Ray is an optional dependency
(``pip install 'servetune[ray]'``): importing this package does not import Ray (only the replica modules do); the
functions below raise ``ConfigError`` with the install command when it is missing.

    serve_on_ray(config, models, address) -> int          run until SIGTERM (the CLI's --backend ray)
    export_serve_config(config, models, path) -> Path       write the ``serve deploy`` / KubeRay config
    plan_models(config, models) -> list[ModelPlan]          what would be deployed
    serve_config(plans, host=, port=, proxy_location=)      the Serve config as a dict
    ModelPlan.served -> ServedModel                         what the frontend and the replicas are told of a model;
                                                            its ``resolve(version)`` is every version lookup on Ray
"""

from __future__ import annotations

from servetune.ray._require import INSTALL_HINT, ray_available, require_ray
from servetune.ray.backend import RayBackend, check_config
from servetune.ray.controller import RayCluster, ReplicaInfo
from servetune.ray.driver import export_serve_config, plan_models, serve_on_ray
from servetune.ray.plan import MAX_ONGOING_BATCHES, ONGOING_BATCHES, ModelPlan, RayVersion, ServedModel
from servetune.ray.serve_config import serve_config, write_serve_config

__all__ = [
    "INSTALL_HINT",
    "MAX_ONGOING_BATCHES",
    "ONGOING_BATCHES",
    "ModelPlan",
    "RayBackend",
    "RayCluster",
    "RayVersion",
    "ReplicaInfo",
    "ServedModel",
    "check_config",
    "export_serve_config",
    "plan_models",
    "ray_available",
    "require_ray",
    "serve_config",
    "serve_on_ray",
    "write_serve_config",
]
