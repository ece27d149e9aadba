"""What to deploy: every start-up model's archive read once in the driver, its settings merged as the native
server merges them (``models=`` JSON < model-config.yaml), and the knobs mapped onto Ray Serve's.

The driver only reads archives here; each replica opens the archive again itself (``ReplicaSpec.url``), so the
path must be visible on every node that runs a replica (a shared volume, or the image).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from servetune._exceptions import ArchiveError, ConfigError, ModelError
from servetune.config.model import ModelConfig, models_json_entry
from servetune.config.server import ServerConfig

FRONTEND_APP = "servetune"
ONGOING_BATCHES = 2  # batches' worth of requests a replica holds by default: one running, one forming
MAX_ONGOING_BATCHES = 64


@dataclass(frozen=True)
class ReplicaSpec:
    """Everything a replica needs to load one model version exactly as a native worker does (JSON-safe)."""

    model_name: str
    version: str
    url: str
    batch_size: int
    model_yaml_config: dict[str, Any] = field(default_factory=dict)
    handler: str | None = None
    gpu: bool = False
    num_threads: int = 1
    limit_max_image_pixels: bool = True
    decode_input_request: bool = True
    max_request_size: int = 6553500
    max_response_size: int = 6553500
    response_timeout_s: float = 120.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ReplicaSpec:
        known = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass(frozen=True)
class VersionPlan:
    """One model version: its replica spec and the Ray Serve knobs that the management API may change."""

    spec: ReplicaSpec
    manifest: dict[str, Any]
    config: ModelConfig
    min_workers: int
    max_workers: int
    max_batch_delay_ms: int
    job_queue_size: int
    num_cpus: float = 1.0
    model_url: str = ""  # as registered (``resnet18.mar``): what the management API reports as modelUrl
    ongoing_batches: int = ONGOING_BATCHES  # model-config ``rayOngoingBatches``
    # the batch size set in place (``PUT /models/{name}?batch_size=``), carried in ``user_config``; None: the
    # one the replicas load with (``spec.batch_size``, part of the application's args: changing it redeploys)
    rebatched: int | None = None

    @property
    def batch_size(self) -> int:
        """The batch size the replicas batch up to now."""
        return self.spec.batch_size if self.rebatched is None else self.rebatched

    @property
    def autoscaling(self) -> bool:
        return self.max_workers > self.min_workers

    @property
    def serving(self) -> bool:
        """False when scaled to 0 workers: no deployment, requests answered 503."""
        return self.max_workers > 0

    def with_api_params(
        self,
        *,
        batch_size: int | None = None,
        max_batch_delay: int | None = None,
        workers: int | None = None,
        response_timeout: int | None = None,
        handler: str | None = None,
    ) -> VersionPlan:
        """The register API's parameters on top of the archive's settings (None leaves a value)."""
        plan = self
        if handler:
            plan = replace(plan, spec=replace(plan.spec, handler=handler))
        if batch_size is not None:
            plan = replace(plan, spec=replace(plan.spec, batch_size=batch_size))
        if response_timeout is not None:
            plan = replace(plan, spec=replace(plan.spec, response_timeout_s=float(response_timeout)))
        if max_batch_delay is not None:
            plan = replace(plan, max_batch_delay_ms=max_batch_delay)
        if workers is not None:
            plan = plan.scaled(workers, workers)
        return plan

    def scaled(self, min_workers: int, max_workers: int) -> VersionPlan:
        return replace(self, min_workers=min_workers, max_workers=max(min_workers, max_workers))

    def rebatched_to(self, batch_size: int | None, max_batch_delay: int | None) -> VersionPlan:
        """New batch size and/or delay for the live replicas (``user_config``: applied without restarting them)."""
        plan = self
        if batch_size is not None:
            plan = replace(plan, rebatched=batch_size)
        if max_batch_delay is not None:
            plan = replace(plan, max_batch_delay_ms=max_batch_delay)
        return plan


@dataclass(frozen=True)
class ModelPlan:
    """A model name: one Ray Serve application at ``/predictions/<name>``, one deployment per version."""

    name: str
    versions: dict[str, VersionPlan]
    default_version: str

    @property
    def serving(self) -> bool:
        return self.versions[self.default_version].serving

    def get(self, version: str | None) -> VersionPlan:
        if version is None:
            return self.versions[self.default_version]
        if version not in self.versions:
            raise ModelError(
                f"Model version: {version} does not exist for model: {self.name}", 404, "ModelVersionNotFoundException"
            )
        return self.versions[version]


def deployment_name(model: str, version: str) -> str:
    """Ray Serve deployment name of a model version, e.g. ``resnet18_v1_0``."""
    return f"{model}_v{re.sub(r'[^A-Za-z0-9_-]', '_', version)}"


def no_worker_message(model: str) -> str:
    return f'Model "{model}" has no worker to serve inference request. Please use scale workers API to add workers.'


def default_workers(config: ServerConfig) -> int:
    """Replicas for a start-up model that names no workers: ``default_workers_per_model``, else 1 (the driver's
    CPU count says nothing about the cluster's)."""
    return config.default_workers_per_model or 1


def plan_version(
    config: ServerConfig, archive_path: Path, name: str | None, *, loaded_at_startup: bool, url: str | None = None
) -> VersionPlan:
    """Read one archive (extracted to a temporary directory and removed) and plan its version."""
    from servetune.archive import open_archive

    tmp = Path(tempfile.mkdtemp(prefix="servetune-plan-"))
    try:
        archive = open_archive(archive_path, tmp / "model")
    except ArchiveError as exc:
        raise ModelError(f"Failed to open model archive {archive_path}: {exc}", 400, "ModelException") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    manifest: dict[str, Any] = dict(archive.manifest.raw)
    info = dict(manifest.get("model") or {})
    name = name or info.get("modelName") or archive_path.name.split(".")[0]
    version = str(info.get("modelVersion") or "1.0")
    model_config = ModelConfig()
    json_entry = (config.models.get(name) or {}).get(version)
    if loaded_at_startup and isinstance(json_entry, dict):
        model_config = models_json_entry(json_entry, source=f"models[{name}][{version}]")
    model_config = model_config.merged(archive.model_config, source=f"{archive_path}: model-config.yaml")
    if model_config.min_workers and (
        model_config.max_workers is None or model_config.max_workers >= model_config.min_workers
    ):
        min_workers = model_config.min_workers
        max_workers = model_config.max_workers or min_workers
    else:  # start-up models get a default; the register API's default is the configured value (0 if unset)
        min_workers = max_workers = default_workers(config) if loaded_at_startup else config.default_workers_per_model
    threads = model_config.num_threads or config.threads_per_worker or 1
    ongoing = model_config.handler_config.get("rayOngoingBatches", ONGOING_BATCHES)
    if isinstance(ongoing, bool) or not isinstance(ongoing, int) or not 1 <= ongoing <= MAX_ONGOING_BATCHES:
        message = (
            f"{archive_path}: model-config.yaml: rayOngoingBatches={ongoing!r}: "
            f"expected an integer 1..{MAX_ONGOING_BATCHES}"
        )
        raise ModelError(message, 400, "BadRequestException")
    spec = ReplicaSpec(
        model_name=name,
        version=version,
        url=str(archive_path.resolve()),
        batch_size=model_config.batch_size,
        model_yaml_config=dict(model_config.handler_config),
        gpu=model_config.device_type == "gpu",
        num_threads=threads,
        limit_max_image_pixels=config.limit_max_image_pixels,
        decode_input_request=config.decode_input_request,
        max_request_size=config.max_request_size,
        max_response_size=config.max_response_size,
        response_timeout_s=float(model_config.response_timeout_s or config.default_response_timeout),
    )
    return VersionPlan(
        spec=spec,
        manifest=manifest,
        config=model_config,
        min_workers=min_workers,
        max_workers=max_workers,
        max_batch_delay_ms=model_config.max_batch_delay_ms,
        job_queue_size=model_config.job_queue_size or config.job_queue_size,
        num_cpus=float(threads),
        model_url=url or str(archive_path),
        ongoing_batches=ongoing,
    )


def plan_models(
    config: ServerConfig,
    models: tuple[str, ...] = (),
    on_error: Callable[[str, ModelError | ConfigError], None] | None = None,
) -> list[ModelPlan]:
    """Plan the start-up models (``--models`` or ``load_models``; ``all`` = every archive in the model store).
    A model that cannot be planned raises, or with ``on_error`` is reported (name or url, error) and left out."""
    from servetune.server import sources
    from servetune.server.app import startup_models

    by_name: dict[str, dict[str, VersionPlan]] = {}
    defaults: dict[str, str] = {}
    for name, url in startup_models(config, models):
        try:
            path = asyncio.run(sources.resolve(url, config.model_store, config.allowed_urls))
            plan = plan_version(config, path, name, loaded_at_startup=True, url=url)
        except (ModelError, ConfigError) as exc:
            if on_error is None:
                raise
            on_error(name or url, exc)
            continue
        model, version = plan.spec.model_name, plan.spec.version
        if model == FRONTEND_APP:
            raise ConfigError(f"model name {model!r} is reserved by the Ray backend for its frontend application")
        versions = by_name.setdefault(model, {})
        if version in versions:
            raise ModelError(
                f"Model version {version} is already registered for model {model}", 409, "ConflictStatusException"
            )
        names = {deployment_name(model, v) for v in versions}
        if deployment_name(model, version) in names:
            raise ConfigError(f"model {model}: versions {sorted(versions)} and {version!r} map to one deployment name")
        versions[version] = plan
        defaults.setdefault(model, version)
    return [ModelPlan(name, versions, defaults[name]) for name, versions in sorted(by_name.items())]


__all__ = [
    "FRONTEND_APP",
    "ModelPlan",
    "ReplicaSpec",
    "VersionPlan",
    "default_workers",
    "deployment_name",
    "no_worker_message",
    "plan_models",
    "plan_version",
]
