"""``servetune serve --backend ray``: the API layer's server over :class:`RayBackend`, and the Serve config export.

serve_on_ray(config, models, address).run()  ->  connect, deploy the frontend  ->  register the start-up models
(each a Serve application)  ->  the same lines and ready file as the native server  ->  wait for a signal  ->
delete the Serve applications and leave the cluster (a local cluster started here stops with it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from servetune._exceptions import ApiError, ConfigError
from servetune.api import sources
from servetune.api.plan import RegisterParams
from servetune.api.server import ApiServer, startup_models
from servetune.config.server import ServerConfig
from servetune.ray.backend import RayBackend, check_config, proxy_location_for
from servetune.ray.plan import ModelPlan, RayVersion, deployment_name, read_plan
from servetune.ray.serve_config import serve_config, write_serve_config


def serve_on_ray(
    config: ServerConfig, models: tuple[str, ...] = (), address: str | None = None, ready_file: Path | None = None
) -> int:
    """Serve the start-up models on Ray until SIGTERM/SIGINT; returns the exit code."""
    return ApiServer(config, RayBackend(config, address), models, ready_file).run()


def plan_models(
    config: ServerConfig,
    models: tuple[str, ...] = (),
    on_error: Callable[[str, ApiError | ConfigError], None] | None = None,
) -> list[ModelPlan]:
    """Plan the start-up models (``--models`` or ``load_models``; ``all`` = every archive in the model store) without a
    cluster. A model that cannot be planned raises, or with ``on_error`` is reported (name or url, error) and left
    out."""
    by_name: dict[str, dict[str, RayVersion]] = {}
    defaults: dict[str, str] = {}
    for name, url in startup_models(config, models):
        try:
            path = asyncio.run(sources.resolve(url, config.model_store, config.allowed_urls))
            version = read_plan(config, path, RegisterParams(url=url, model_name=name, loaded_at_startup=True))
        except (ApiError, ConfigError) as exc:
            if on_error is None:
                raise
            on_error(name or url, exc)
            continue
        versions = by_name.setdefault(version.name, {})
        if version.version in versions:
            raise ApiError.conflict(f"Model version {version.version} is already registered for model {version.name}")
        if deployment_name(version.name, version.version) in {deployment_name(version.name, v) for v in versions}:
            raise ConfigError(
                f"model {version.name}: versions {sorted(versions)} and {version.version!r} map to one deployment name"
            )
        versions[version.version] = version
        defaults.setdefault(version.name, version.version)
    return [ModelPlan(name, versions, defaults[name]) for name, versions in sorted(by_name.items())]


def export_serve_config(config: ServerConfig, models: tuple[str, ...], path: Path) -> Path:
    """Write the Ray Serve config (``serve deploy`` / KubeRay ``serveConfigV2``) for the start-up models."""
    check_config(config)
    address = config.inference_address
    plans = plan_models(config, models)
    written = serve_config(
        plans,
        host=address.host,
        port=address.port,
        proxy_location=proxy_location_for(address.host),
        server=config,
    )
    return write_serve_config(path, written)


__all__ = ["export_serve_config", "plan_models", "serve_on_ray"]
