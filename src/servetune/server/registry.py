"""The model registry: versions of each model, the default version, registration from archives."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servetune._exceptions import ArchiveError, ConfigError, ModelError
from servetune.config.model import ModelConfig, models_json_entry
from servetune.config.server import ServerConfig
from servetune.hardware import detect_gpus, physical_cores
from servetune.server import sources
from servetune.server.metrics import ServerMetrics
from servetune.server.model import ModelSpec, ServedModel
from servetune.server.process import WorkerDied, WorkerLoadError, WorkerTimeout

log = logging.getLogger("servetune.registry")


@dataclass(frozen=True)
class RegisterParams:
    """The register API's parameters; None means "not given"."""

    url: str
    model_name: str | None = None
    handler: str | None = None
    batch_size: int | None = None
    max_batch_delay: int | None = None
    initial_workers: int | None = None
    response_timeout: int | None = None
    startup_timeout: int | None = None
    synchronous: bool = True
    loaded_at_startup: bool = False


class ModelRegistry:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.models: dict[str, dict[str, ServedModel]] = {}
        self.defaults: dict[str, str] = {}
        self.metrics = ServerMetrics(self.all_models)
        self.gpus = detect_gpus() if config.number_of_gpu is None else min(config.number_of_gpu, detect_gpus())
        self._gpu_counter = 0
        self._workdir = Path(tempfile.mkdtemp(prefix="servetune-models-"))
        self._lock = asyncio.Lock()
        self._background: set[asyncio.Task[Any]] = set()

    # ---- lookup ------------------------------------------------------------------------------

    def all_models(self) -> list[ServedModel]:
        return [m for versions in self.models.values() for m in versions.values()]

    def get(self, name: str, version: str | None = None) -> ServedModel:
        versions = self.models.get(name)
        if not versions:
            raise ModelError(f"Model not found: {name}", 404, "ModelNotFoundException")
        if version is None:
            return versions[self.defaults[name]]
        if version not in versions:
            raise ModelError(
                f"Model version: {version} does not exist for model: {name}", 404, "ModelVersionNotFoundException"
            )
        return versions[version]

    # ---- workers: threads and GPUs -----------------------------------------------------------

    def worker_threads(self, model: ServedModel) -> int:
        """Intra-op threads for each of ``model``'s workers: its ``numThreads``, else ``threads_per_worker``, else
        the physical cores shared by every worker of every model (so it changes as workers are scaled)."""
        threads = model.config.num_threads or self.config.threads_per_worker
        if not threads:
            total = sum(max(m.min_workers, m.ready_workers) for m in self.all_models()) or 1
            threads = max(1, physical_cores() // total)
        return threads

    def _worker_env(self, model: ServedModel) -> tuple[int, dict[str, str]]:
        threads = self.worker_threads(model)
        env = dict(os.environ)
        env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"})
        return threads, env

    def _assign_gpu(self, config: ModelConfig, slot_id: int) -> int | None:
        if config.device_type == "cpu" or self.gpus == 0:
            return None
        if config.device_ids:
            usable = [i for i in config.device_ids if i < self.gpus]
            if usable:
                return usable[slot_id % len(usable)]
        gpu = self._gpu_counter % self.gpus
        self._gpu_counter += 1
        return gpu

    def default_workers(self) -> int:
        if self.config.default_workers_per_model:
            return self.config.default_workers_per_model
        return self.gpus or os.cpu_count() or 1

    # ---- register / unregister ---------------------------------------------------------------

    async def register(self, params: RegisterParams) -> tuple[int, str]:
        """Register a model version; returns (HTTP status, status message)."""
        path = await sources.resolve(params.url, self.config.model_store, self.config.allowed_urls)
        dest = Path(tempfile.mkdtemp(prefix="archive-", dir=self._workdir))
        from servetune.archive import open_archive

        try:
            archive = await asyncio.to_thread(open_archive, path, dest)
        except ArchiveError as exc:
            shutil.rmtree(dest, ignore_errors=True)
            raise ModelError(f"Failed to open model archive {params.url}: {exc}", 400, "ModelException") from None
        manifest: dict[str, Any] = dict(archive.manifest.raw)
        model_info = dict(manifest.get("model") or {})
        name = params.model_name or model_info.get("modelName") or path.name.split(".")[0]
        version = str(model_info.get("modelVersion") or "1.0")
        if params.handler:
            model_info["handler"] = params.handler
        manifest["model"] = model_info
        config = ModelConfig()
        try:
            json_entry = (self.config.models.get(name) or {}).get(version)
            if params.loaded_at_startup and isinstance(json_entry, dict):
                config = models_json_entry(json_entry, source=f"models[{name}][{version}]")
            config = config.merged(archive.model_config, source=f"{params.url}: model-config.yaml")
        except ConfigError as exc:
            shutil.rmtree(dest, ignore_errors=True)
            raise ModelError(str(exc), 400, "BadRequestException") from None
        config = config.with_api_params(
            batch_size=params.batch_size,
            max_batch_delay_ms=params.max_batch_delay,
            response_timeout_s=params.response_timeout,
            startup_timeout_s=params.startup_timeout,
        )
        workers = params.initial_workers
        if workers is None:
            if config.min_workers and (config.max_workers is None or config.max_workers >= config.min_workers):
                workers = config.min_workers
            elif params.loaded_at_startup:
                workers = self.default_workers()
            else:
                workers = self.config.default_workers_per_model
        async with self._lock:
            if version in self.models.get(name, {}):
                shutil.rmtree(dest, ignore_errors=True)
                raise ModelError(
                    f"Model version {version} is already registered for model {name}", 409, "ConflictStatusException"
                )
            spec = ModelSpec(
                name,
                version,
                params.url,
                archive.model_dir,
                manifest,
                config,
                params.loaded_at_startup,
                {
                    "limit_max_image_pixels": self.config.limit_max_image_pixels,
                    "decode_input_request": self.config.decode_input_request,
                    "workdir": dest,
                },
            )
            model = ServedModel(
                spec,
                job_queue_size=config.job_queue_size or self.config.job_queue_size,
                response_timeout_s=config.response_timeout_s or self.config.default_response_timeout,
                startup_timeout_s=config.startup_timeout_s or self.config.default_startup_timeout,
                worker_env=self._worker_env,
                worker_threads=self.worker_threads,
                assign_gpu=self._assign_gpu,
                on_batch=self.metrics.observe_batch,
            )
            model.min_workers = workers
            self.models.setdefault(name, {})[version] = model
            self.defaults.setdefault(name, version)
        if workers == 0:
            return 200, (
                f'Model "{name}" Version: {version} registered with 0 initial workers. '
                "Use scale workers API to add workers for the model."
            )
        if not params.synchronous:
            self._spawn(self._scale_or_unregister(model, workers))
            return 202, "Processing worker updates..."
        await self._scale_or_unregister(model, workers)
        return 200, f'Model "{name}" Version: {version} registered with {workers} initial workers'

    async def _scale_or_unregister(self, model: ServedModel, workers: int) -> None:
        try:
            await model.scale(workers)
        except (WorkerLoadError, WorkerTimeout, WorkerDied, OSError) as exc:
            await self._remove(model)
            raise ModelError(
                f"Failed to start workers for model {model.name} version {model.version}: {exc}",
                500,
                "InternalServerException",
            ) from None

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._background.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("background worker update failed: %s", t.exception())

        task.add_done_callback(done)

    async def _remove(self, model: ServedModel, grace_s: float = 0.0) -> None:
        versions = self.models.get(model.name, {})
        if versions.get(model.version) is model:
            del versions[model.version]
            if not versions:
                self.models.pop(model.name, None)
                self.defaults.pop(model.name, None)
            elif self.defaults.get(model.name) == model.version:
                self.defaults[model.name] = sorted(versions)[0]
        await model.close(grace_s)
        workdir = model.spec.extras.get("workdir")
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    async def unregister(self, name: str, version: str | None) -> str:
        model = self.get(name, version)
        versions = self.models[name]
        if version is not None and self.defaults[name] == version and len(versions) > 1:
            raise ModelError(
                f"Cannot remove default version {version} for model {name}", 403, "InvalidModelVersionException"
            )
        await self._remove(model, grace_s=self.config.shutdown_grace_period)
        return f'Model "{name}" unregistered'

    async def scale(
        self, name: str, version: str | None, min_worker: int, max_worker: int, synchronous: bool
    ) -> tuple[int, str]:
        model = self.get(name, version)
        suffix = "" if version is None else f", version: {version}"
        if not synchronous:
            self._spawn(model.scale(min_worker, max_worker))
            return 202, "Processing worker updates..."
        try:
            await model.scale(min_worker, max_worker)
        except (WorkerLoadError, WorkerTimeout, WorkerDied, OSError) as exc:
            raise ModelError(
                f"Failed to start workers for model {name}: {exc}", 500, "InternalServerException"
            ) from None
        return 200, f"Workers scaled to {min_worker} for model: {name}{suffix}"

    def set_default(self, name: str, version: str) -> str:
        self.get(name, version)
        self.defaults[name] = version
        return f'Default version successfully updated for model "{name}" to "{version}"'

    async def close(self, grace_s: float) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*(m.close(grace_s) for m in self.all_models()), return_exceptions=True)
        self.models.clear()
        shutil.rmtree(self._workdir, ignore_errors=True)
