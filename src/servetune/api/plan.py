"""What registering a model version means, decided once for every backend: the register API's parameters
(:class:`RegisterParams`) and the archive's settings become a typed :class:`VersionPlan`.

Settings precedence (TorchServe's documented one): ``models=`` JSON in config.properties (start-up models only)
< ``model-config.yaml`` in the archive < the register API's parameters. Workers: an archive's
``minWorkers``/``maxWorkers`` (when min > 0 and max >= min) win over ``initial_workers``, as in TorchServe's
``ApiUtils.handleRegister``; a start-up model that names none gets ``default_workers``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from servetune._exceptions import ApiError, ArchiveError, ConfigError
from servetune.api.metadata import declared_metadata
from servetune.archive import ModelArchive, validate_model_name
from servetune.config.model import ModelConfig, models_json_entry
from servetune.config.server import ServerConfig
from servetune.handlers.spec import WorkerSpec

RUNTIMES = ("python", "python3", "LSP")  # TorchServe's Manifest.RuntimeType values


@dataclass(frozen=True)
class RegisterParams:
    """The register API's parameters, parsed; None means "not given"."""

    url: str
    model_name: str | None = None
    handler: str | None = None
    runtime: str | None = None
    batch_size: int | None = None
    max_batch_delay: int | None = None
    initial_workers: int | None = None
    response_timeout: int | None = None
    startup_timeout: int | None = None
    synchronous: bool = True
    loaded_at_startup: bool = False


@dataclass(frozen=True)
class VersionPlan:
    """One model version, as every backend serves it (JSON-safe: Ray ships it to its replicas)."""

    name: str
    version: str
    url: str  # as registered: what describe reports as ``modelUrl``
    archive: str  # the resolved local path of the archive (a file, or a directory used in place)
    manifest: dict[str, Any]  # MANIFEST.json, with a register-time ``handler`` applied
    config: ModelConfig
    min_workers: int
    max_workers: int
    response_timeout_s: int
    startup_timeout_s: int
    job_queue_size: int
    runtime: str = "python"
    loaded_at_startup: bool = False
    default_threads: int = 0  # the server's threads per worker when the model names none (0: automatic share)
    default_pinning: bool = False  # the server's cpuPinning default (cpu_launcher_enable)
    default_preload: str = "auto"  # the server's workerPreload default (worker_preload)
    limit_max_image_pixels: bool = True
    decode_input_request: bool = True
    service_envelope: str | None = None  # TorchServe's service_envelope: requests on its own routes
    tensor_limits: tuple[int, int, int] | None = None  # the server's max_tensor_* keys, for the worker's envelopes

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def max_batch_delay_ms(self) -> int:
        return self.config.max_batch_delay_ms

    @property
    def num_threads(self) -> int:
        """Configured intra-op threads per worker; 0: an automatic share of the physical cores."""
        return self.config.num_threads or self.default_threads

    @property
    def cpu_pinning(self) -> bool:
        return self.default_pinning if self.config.cpu_pinning is None else self.config.cpu_pinning

    @property
    def worker_preload(self) -> str:
        """How the workers start: ``auto``, ``model``, ``imports`` or ``off`` (model-config.yaml's ``workerPreload``,
        else the server's ``worker_preload``)."""
        return self.config.worker_preload or self.default_preload

    @property
    def gpu(self) -> bool:
        return self.config.device_type == "gpu"

    def with_config(self, config: ModelConfig) -> VersionPlan:
        return replace(self, config=config)

    def worker_spec(
        self, model_dir: Path, *, gpu_id: int | None, num_threads: int, cpu_cores: tuple[int, ...] = ()
    ) -> WorkerSpec:
        """How a worker (native) or replica (Ray) of this version loads it."""
        return WorkerSpec(
            model_name=self.name,
            model_dir=str(model_dir),
            manifest=self.manifest,
            batch_size=self.batch_size,
            model_yaml_config=dict(self.config.handler_config),
            gpu_id=gpu_id,
            num_threads=num_threads,
            inter_op_threads=self.config.inter_op_threads,
            cpu_cores=cpu_cores,
            limit_max_image_pixels=self.limit_max_image_pixels,
            decode_input_request=self.decode_input_request,
            service_envelope=self.service_envelope,
            tensor_limits=self.tensor_limits,
        )

    def to_json(self) -> dict[str, Any]:
        raw = asdict(self)
        raw["config"] = self.config.to_json()
        return raw

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> VersionPlan:
        values = dict(raw)
        values["config"] = ModelConfig.from_json(values["config"])
        if values.get("tensor_limits") is not None:
            values["tensor_limits"] = tuple(values["tensor_limits"])
        return cls(**values)


def check_handler(handler: Any, model_dir: Path, *, source: str) -> None:
    """A manifest's (or the register API's) ``handler`` naming a file must name one inside the archive: TorchServe
    imports the basename of ``../../elsewhere/x.py`` from wherever ``x`` is importable, so a file outside the archive
    (the server's working directory) could run. ApiError 400 for a path that leaves the archive, or a ``.py`` file
    the archive does not have; module names (``mypkg.handler``, built-ins) are left to the worker to import."""
    if not isinstance(handler, str) or not handler.strip():
        return
    module = handler.partition(":")[0].strip()
    path = module.replace("\\", "/")
    if "/" not in path and not path.endswith(".py"):
        return
    parts = path.split("/")
    if path.startswith("/") or ".." in parts or (len(parts[0]) >= 2 and parts[0][1] == ":"):
        raise ApiError.bad_request(
            f"{source}: handler {handler!r} must name a file inside the archive (no absolute path, no '..')"
        )
    stem = parts[-1].removesuffix(".py")
    if not ((model_dir / f"{stem}.py").is_file() or (model_dir / stem / "__init__.py").is_file()):
        raise ApiError.bad_request(f"{source}: handler {handler!r} names {stem}.py, which the archive does not contain")


def plan_version(
    config: ServerConfig, archive: ModelArchive, archive_path: Path, params: RegisterParams, default_workers: int
) -> VersionPlan:
    """Plan a version from its opened archive; raises ApiError 400 for settings that are invalid."""
    manifest: dict[str, Any] = dict(archive.manifest.raw)
    info = dict(manifest.get("model") or {})
    name = params.model_name or info.get("modelName") or archive_path.name.split(".")[0]
    try:
        validate_model_name(name)
    except ArchiveError as exc:
        raise ApiError.bad_request(f"{params.url}: {exc}") from None
    version = str(info.get("modelVersion") or "1.0")
    if params.handler:
        info["handler"] = params.handler
    manifest["model"] = info
    check_handler(info.get("handler"), archive.model_dir, source=params.url)
    limit = config.max_workers_per_model
    model_config = ModelConfig()
    try:
        entry = (config.models.get(name) or {}).get(version) or (config.model_snapshot.get(name) or {}).get(version)
        if params.loaded_at_startup and isinstance(entry, dict):
            model_config = models_json_entry(entry, source=f"models[{name}][{version}]", max_workers=limit)
        source = f"{params.url}: model-config.yaml"
        model_config = model_config.merged(archive.model_config, source=source, max_workers=limit)
        declared_metadata(model_config.handler_config, source=f"{params.url}: model-config.yaml")
    except ConfigError as exc:
        raise ApiError.bad_request(str(exc)) from None
    model_config = model_config.with_api_params(
        batch_size=params.batch_size,
        max_batch_delay_ms=params.max_batch_delay,
        response_timeout_s=params.response_timeout,
        startup_timeout_s=params.startup_timeout,
    )
    yaml_min, yaml_max = model_config.min_workers or 0, model_config.max_workers
    if yaml_min > 0 and (yaml_max is None or yaml_max >= yaml_min):
        min_workers, max_workers = yaml_min, yaml_max or yaml_min
    elif params.initial_workers is not None:
        min_workers = max_workers = max(0, params.initial_workers)  # TorchServe: <= 0 registers with 0 workers
    elif params.loaded_at_startup:  # the host's count (GPUs, CPUs) is a default, not a request: within the limit
        min_workers = max_workers = min(default_workers, limit)
    else:
        min_workers = max_workers = config.default_workers_per_model
    return VersionPlan(
        name=name,
        version=version,
        url=params.url,
        archive=str(archive_path),
        manifest=manifest,
        config=model_config,
        min_workers=min_workers,
        max_workers=max_workers,
        response_timeout_s=model_config.response_timeout_s or config.default_response_timeout,
        startup_timeout_s=(
            model_config.startup_timeout_s
            if model_config.startup_timeout_s is not None
            else config.default_startup_timeout
        ),
        job_queue_size=model_config.job_queue_size or config.job_queue_size,
        runtime=params.runtime or str(manifest.get("runtime") or "python"),
        loaded_at_startup=params.loaded_at_startup,
        default_threads=config.default_threads,
        default_pinning=config.cpu_launcher_enable,
        default_preload=config.worker_preload,
        limit_max_image_pixels=config.limit_max_image_pixels,
        decode_input_request=config.decode_input_request,
        service_envelope=config.service_envelope,
        tensor_limits=(config.max_tensor_elements, config.max_tensor_dims, config.max_empty_tensor_span),
    )


__all__ = ["RUNTIMES", "RegisterParams", "VersionPlan", "check_handler", "plan_version"]
